"""``Flag``, the producer's room and idle flags: an ``asyncio.Event`` that makes no deque until someone waits."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from smartclient.stream.flag import Flag


async def test_a_set_flag_is_waited_for_at_once_and_a_cleared_one_until_it_is_set() -> None:
    flag = Flag()
    await asyncio.wait_for(flag.wait(), 1)
    flag.clear()
    waiters = [asyncio.ensure_future(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters) and not flag.is_set()
    flag.set()
    await asyncio.wait_for(asyncio.gather(*waiters), 1)  # every waiter
    assert flag.is_set() and flag._waiters is None


async def test_a_wait_that_times_out_or_is_cancelled_leaves_nothing_behind() -> None:
    flag = Flag(False)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(flag.wait(), 0.01)
    cancelled = asyncio.ensure_future(flag.wait())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert flag._waiters == []
    flag.set()  # (nobody left to wake)
    assert flag.is_set()


def test_a_flag_takes_a_fraction_of_an_events_memory() -> None:
    def traced(make: object) -> int:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = [make() for _ in range(1000)]  # type: ignore[operator]
            return tracemalloc.get_traced_memory()[0] - before + 0 * len(kept)
        finally:
            tracemalloc.stop()

    assert traced(Flag) * 4 < traced(asyncio.Event)
