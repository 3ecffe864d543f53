"""Producer back-pressure, bounded three times: max_in_flight, enqueue_timeout, confirm_timeout.  No broker."""

from __future__ import annotations

import asyncio

import pytest

from smartclient import CONFIRM_TIMEOUT, BatchingPolicy, ConfigurationError, Confirmation, EnqueueTimeout, PublishFailed
from tests.conftest import wait_until
from tests.unit.fakes import FakeClient, confirm, publish_buffer


async def test_a_send_that_finds_no_room_raises_enqueue_timeout_and_queues_nothing() -> None:
    buffer = publish_buffer(max_in_flight=4, enqueue_timeout=0.05)
    for pid in range(1, 5):
        await buffer.add(pid, b"m")
    outcome: list[Confirmation] = []
    with pytest.raises(EnqueueTimeout, match=r"no room .* after 0.05 s: 4 message\(s\) wait for a confirm"):
        await buffer.add(5, b"m", outcome.append)
    assert buffer.in_flight == 4 and 5 not in buffer._pending and not buffer._waiters.get(5)
    confirm(buffer, 1, 2)
    await buffer.add(5, b"m")  # room again: the same id goes through
    assert buffer.in_flight == 3


async def test_send_many_says_how_many_it_queued_before_the_timeout() -> None:
    buffer = publish_buffer(max_in_flight=4, enqueue_timeout=0.05)
    with pytest.raises(EnqueueTimeout) as caught:
        await buffer.add_many(1, [b"m"] * 7)
    assert caught.value.queued == 4 and sorted(buffer._pending) == [1, 2, 3, 4]
    assert isinstance(caught.value, PublishFailed)  # one except clause for every message not accepted


async def test_a_message_not_confirmed_in_time_fails_with_confirm_timeout_and_a_reason() -> None:
    buffer = publish_buffer(max_in_flight=4, confirm_timeout=0.08)
    outcomes: list[Confirmation] = []
    await buffer.add(1, b"a", outcomes.append)
    await buffer.add(2, b"b", outcomes.append)  # a full batch: written, the expiry timer starts
    confirm(buffer, 2)
    await asyncio.sleep(0.05)
    await buffer.add(3, b"c", outcomes.append)
    buffer._flush()
    await wait_until(lambda: buffer.timed_out == 1, 1, "the first to time out", interval=0.005)
    assert outcomes[-1] == Confirmation(1, False, CONFIRM_TIMEOUT, "not confirmed within 0.08 s")
    assert buffer.in_flight == 1  # 3 was queued later: its own time runs
    await wait_until(lambda: buffer.in_flight == 0, 1, "nothing in flight", interval=0.005)
    assert [o.publishing_id for o in outcomes] == [2, 1, 3] and buffer.failed == 2
    assert buffer._expiry is None  # nothing pending: no timer left behind


async def test_confirm_timeout_zero_is_off() -> None:
    buffer = publish_buffer(max_in_flight=4, confirm_timeout=0)
    await buffer.add(1, b"a")
    await buffer.add(2, b"b")
    assert buffer._expiry is None


@pytest.mark.parametrize("kwargs", [{"enqueue_timeout": 0}, {"enqueue_timeout": -1}, {"confirm_timeout": -1},
                                    {"confirm_timeout": 10**6}])
def test_bad_timeouts_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
        BatchingPolicy(**kwargs)


async def test_the_confirm_clock_stops_while_the_producer_recovers() -> None:
    buffer = publish_buffer(max_in_flight=4, confirm_timeout=0.04)
    await buffer.add(1, b"a")
    await buffer.add(2, b"b")  # written: the timer runs
    buffer.suspend()
    await asyncio.sleep(0.15)  # well past the timeout, but recovering
    assert buffer.timed_out == 0 and buffer.in_flight == 2
    buffer.resume(FakeClient(), 0)  # sent again: the clock starts again
    await wait_until(lambda: buffer.timed_out == 2, 1, "both to time out", interval=0.005)


async def test_a_confirm_callback_that_raises_does_not_keep_the_others_from_their_answer() -> None:
    buffer = publish_buffer(max_in_flight=4)
    seen: list[int] = []

    def bad(c: Confirmation) -> None:
        raise RuntimeError("application bug")

    await buffer.add(1, b"a", bad)
    await buffer.add(2, b"b", lambda c: seen.append(c.publishing_id))
    confirm(buffer, 1, 2)
    assert seen == [2] and buffer.in_flight == 0
    await asyncio.wait_for(buffer.flush(), 1)
