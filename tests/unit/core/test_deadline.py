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


def test_a_step_with_no_time_left_lets_go_of_its_future_without_leaving_an_error_unread() -> None:
    """A shared lookup (read by its owner, as the topology cache reads its lookups) that a later asker joins with no
    time left: the shield is left to take the lookup's error and has it read (cancelling it made Python 3.14 report
    "exception in shielded future"); a task already done has its error read at once (issue 53: asyncio's "exception
    was never retrieved")."""
    async def failing() -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("the lookup failed")

    async def main() -> tuple[bool, bool]:
        lookup = asyncio.ensure_future(failing())
        lookup.add_done_callback(lambda task: task.exception())  # its owner reads it
        with deadline.attempt(0.0, "an attempt with no time"):
            with pytest.raises(StepTimeout):
                await deadline.step("joining it", asyncio.shield(lookup))
            await asyncio.sleep(0.05)
            done = asyncio.ensure_future(failing())
            await asyncio.wait([done])
            with pytest.raises(StepTimeout):
                await deadline.step("a finished one", done)
        return lookup.done(), done.done()

    unread: list[dict[str, object]] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: unread.append(context))
    try:
        assert loop.run_until_complete(main()) == (True, True)
    finally:
        loop.close()
    import gc

    gc.collect()
    assert unread == []


def test_a_step_whose_caller_is_cancelled_leaves_no_error_unread() -> None:
    """CI (waits): a recovery cancelled while its connection's login was failing left rstream's ``authenticate()``
    task with "exception was never retrieved": Python 3.11's ``wait_for`` inside the step turns a cancellation that
    comes with the answer's error into that error.  The step reads it; whoever awaits the step still gets it."""
    async def login(answer: asyncio.Future[None]) -> None:
        try:
            await answer
        except asyncio.CancelledError:
            raise ConnectionResetError("closed the connection before answering") from None

    async def main() -> None:
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with deadline.attempt(5.0, "a recovery"):
            recovery = asyncio.ensure_future(deadline.step("authenticate", login(answer)))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            recovery.cancel()
            # 3.11's wait_for ends the step cancelled (the login's error left in its task); 3.12's passes it on
            with pytest.raises((asyncio.CancelledError, ConnectionResetError)):
                await recovery
            with pytest.raises(ConnectionResetError, match="before answering"):  # awaited: still raised
                await _raise_through_step()

    async def _raise_through_step() -> None:
        async def fails() -> None:
            raise ConnectionResetError("closed the connection before answering")
        await deadline.step("authenticate", fails())

    unread: list[dict[str, object]] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: unread.append(context))
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    import gc

    gc.collect()
    assert unread == []


def test_a_cancellation_that_comes_as_the_inner_work_ends_is_not_lost() -> None:
    """Before Python 3.12, ``asyncio.wait_for`` cancelled at the moment its inner work ended returned the result and
    dropped the cancellation: a hedge cancelled as its TCP open ended went on to its handshake, through an LB that
    held it for a dead node, and the dial that had won waited 3 s for it (issue 57's fleet).  ``within`` raises
    it, on every version, as 3.12's ``wait_for`` does."""
    async def main() -> list[str]:
        said: list[str] = []
        inner: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def caller() -> None:
            try:
                said.append(f"got {await deadline.within(inner, 5.0)}")
            except asyncio.CancelledError:
                said.append("cancelled")
                raise
            said.append("went on")  # (wait_for's way, before 3.12)

        task = asyncio.create_task(caller())
        await asyncio.sleep(0)
        inner.set_result("an answer")
        task.cancel()  # the same moment: the caller has not run since the answer came
        with pytest.raises(asyncio.CancelledError):
            await task
        return said

    assert asyncio.run(main()) == ["cancelled"]


def test_within_cancels_its_inner_work_with_the_caller_and_at_its_limit() -> None:
    async def main() -> tuple[bool, bool, str]:
        slow = asyncio.ensure_future(asyncio.sleep(30))
        caller = asyncio.ensure_future(deadline.within(slow, 5.0))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        late = asyncio.ensure_future(asyncio.sleep(30))
        with pytest.raises(asyncio.TimeoutError):
            await deadline.within(late, 0.01)
        quick = asyncio.ensure_future(asyncio.sleep(0, "answer"))
        return slow.cancelled(), late.cancelled(), await deadline.within(quick, 1.0)

    assert asyncio.run(main()) == (True, True, "answer")
