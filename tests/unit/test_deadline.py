"""The per-attempt deadline: whose tasks see it, and what a step records.  No broker."""

from __future__ import annotations

import asyncio
import time

import pytest

from smartclient import StepTimeout
from smartclient.core import deadline


def test_deadline_belongs_to_the_attempts_tasks_only() -> None:
    async def main() -> list[object]:
        seen: list[object] = []
        with deadline.attempt(5.0, "an attempt"):
            seen.append(deadline.current() is not None)

            async def inherited() -> None:  # a task that only inherits the context (a reader, a callback)
                seen.append(deadline.current())

            await asyncio.create_task(inherited())
            seen.append(await deadline.step("a step", _nested()))
        return seen

    async def _nested() -> bool:
        return deadline.current() is not None  # a step's own work still sees it

    started = time.monotonic()
    assert asyncio.run(main()) == [True, None, True]
    assert time.monotonic() - started < 5


def test_a_step_gets_the_time_left_and_says_so() -> None:
    async def main() -> str:
        with deadline.attempt(0.2, "a short attempt") as attempt:
            with pytest.raises(StepTimeout, match=r"slow: no answer within 0\.\d+ s, the time left of a short attempt"):
                await deadline.step("slow", asyncio.sleep(5))
            return attempt.log()

    started = time.monotonic()
    assert "slow" in asyncio.run(main()) and "timeout" in asyncio.run(main())
    assert time.monotonic() - started < 2


def test_an_attempt_knows_which_steps_it_got_past() -> None:
    async def main() -> deadline.Deadline:
        with deadline.attempt(0.2, "an attempt") as attempt:
            await deadline.step("reading the topology of 's'", asyncio.sleep(0))
            with pytest.raises(StepTimeout):
                await deadline.step("waiting for the member on n2:5552", asyncio.sleep(5))
            return attempt

    attempt = asyncio.run(main())
    assert attempt.got_past("reading the topology")
    assert not attempt.got_past("waiting for the member")  # (it timed out: in the log, not among those passed)
