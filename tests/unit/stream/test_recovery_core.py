"""The pure parts of recovery: the back-off schedule, and PublishBuffer's suspend / resend / fail."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from smartclient import CONNECTION_LOST, ConfigurationError, PublishFailed, RecoveryPolicy
from smartclient.stream.publishing import BatchingPolicy, Confirmation, PublishBuffer
from tests.unit.fakes import FakeClient, confirm, publish_buffer


# -- RecoveryPolicy -------------------------------------------------------------------------------
def test_first_delays_grow_from_initial_to_max_without_jitter() -> None:
    policy = RecoveryPolicy(initial_delay=0.1, factor=2, max_delay=1.0, jitter=0)
    assert [policy.next_delay(n, 0) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_jitter_stays_within_its_fraction() -> None:
    policy = RecoveryPolicy(initial_delay=1.0, max_delay=1.0, jitter=0.2)
    rng = random.Random(7)
    delays = [policy.next_delay(1, 0, rng=rng) for _ in range(500)]
    assert all(d is not None and 0.8 <= d <= 1.2 for d in delays)
    assert len({round(d or 0, 3) for d in delays}) > 50  # spread, not lock step


def test_every_recovery_is_bounded_by_attempts_and_by_time() -> None:
    policy = RecoveryPolicy(max_attempts=5, max_time=10.0, jitter=0)
    assert policy.next_delay(4, 1.0) is not None
    assert policy.next_delay(5, 1.0) is None
    assert policy.next_delay(1, 10.0) is None
    assert policy.next_delay(1, 9.99) == pytest.approx(0.01)  # never sleeps past max_time


def test_authentication_failures_stop_at_once_or_wait_the_longest_delay() -> None:
    assert RecoveryPolicy().next_delay(1, 0, authentication=True) is None
    slow = RecoveryPolicy(retry_authentication=True, max_delay=4.0, jitter=0)
    assert slow.next_delay(1, 0, authentication=True) == 4.0  # never a tight loop


def test_an_attempt_that_got_past_its_topology_read_is_followed_at_once_within_the_bounds() -> None:
    policy = RecoveryPolicy(max_attempts=5, max_time=10.0, jitter=0)
    assert policy.next_delay(3, 1.0) == pytest.approx(0.256)
    assert policy.next_delay(3, 1.0, progressed=True) == 0.0  # the stream is back: no back-off
    assert policy.next_delay(5, 1.0, progressed=True) is None  # still bounded by attempts ...
    assert policy.next_delay(1, 10.0, progressed=True) is None  # ... and by time
    assert policy.next_delay(1, 0, authentication=True, progressed=True) is None


def test_disabled_gives_up_at_once() -> None:
    assert RecoveryPolicy(enabled=False).next_delay(1, 0) is None


@pytest.mark.parametrize("kwargs", [
    dict(initial_delay=-1), dict(initial_delay=10, max_delay=1), dict(factor=0.5), dict(jitter=1.0),
    dict(max_attempts=0), dict(max_time=0), dict(attempt_time=0),
])
def test_bad_policies_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RecoveryPolicy(**kwargs)


# -- PublishBuffer --------------------------------------------------------------------------------
def error(buffer: PublishBuffer, code: int, *ids: int) -> None:
    errors = [SimpleNamespace(publishing_id=i, response_code=code) for i in ids]
    buffer._on_error(SimpleNamespace(publisher_id=buffer.publisher_id, errors=errors))


async def test_resume_writes_every_unconfirmed_message_again_in_order_before_later_ones() -> None:
    old, new = FakeClient(), FakeClient()
    buffer = publish_buffer(old)
    futures = []
    for pid in range(1, 6):
        future: asyncio.Future[Confirmation] = asyncio.get_running_loop().create_future()
        await buffer.add(pid, b"x%d" % pid, future)
        futures.append(future)
    buffer._flush()
    confirm(buffer, 1, 2)
    assert old.ids_written() == [1, 2, 3, 4, 5] and buffer.in_flight == 3
    buffer.suspend()
    await buffer.add(6, b"x6")  # queued while suspended: nothing written anywhere
    buffer._flush()
    assert old.ids_written() == [1, 2, 3, 4, 5] and new.frames == []
    assert buffer.resume(new, 7) == 4
    await buffer.add(7, b"x7")
    buffer._flush()
    assert new.ids_written() == [3, 4, 5, 6, 7]
    assert not old._handlers[next(iter(old._handlers))]  # the old connection's handlers are gone
    confirm(buffer, 1)  # a late duplicate confirm changes nothing
    confirm(buffer, 3, 4, 5, 6, 7)
    await asyncio.wait_for(buffer.flush(), 1)
    assert [f.result().publishing_id for f in futures] == [1, 2, 3, 4, 5]
    # 3, 4 and 5 were written again; 6 was queued while suspended and written the first time; each counted once
    assert buffer.confirmed == 7 and buffer.in_flight == 0 and buffer.resent == 3 and buffer.sent == 7


async def test_fail_all_settles_every_pending_message_with_the_reason_and_refuses_later_sends() -> None:
    buffer = publish_buffer(FakeClient())
    outcomes: list[Confirmation] = []
    future: asyncio.Future[Confirmation] = asyncio.get_running_loop().create_future()
    await buffer.add(1, b"a", future)
    await buffer.add(2, b"b", outcomes.append)
    buffer.fail_all("gave up after 3 attempts")
    with pytest.raises(PublishFailed, match="gave up after 3 attempts"):
        await future
    assert outcomes == [Confirmation(2, False, CONNECTION_LOST, "gave up after 3 attempts")]
    with pytest.raises(PublishFailed, match="stopped: gave up"):
        await buffer.add(3, b"c")
    with pytest.raises(PublishFailed):
        await buffer.flush()
    assert buffer.in_flight == 0 and buffer.failed == 2


async def test_publisher_gone_keeps_messages_pending_and_reports_the_loss() -> None:
    lost: list[str] = []
    buffer = publish_buffer(FakeClient(), lost)
    await buffer.add(1, b"a")
    await buffer.add(2, b"b")
    error(buffer, 18, 1, 2)  # publisher does not exist: not the message's fault
    assert buffer.in_flight == 2 and buffer.failed == 0 and buffer.suspended
    assert lost == ["the broker answered 'publisher does not exist'"]
    error(buffer, 17, 1)  # a real refusal (precondition failed) settles it
    assert buffer.in_flight == 1 and buffer.failed == 1


async def test_sends_wait_for_room_while_suspended_and_nothing_is_dropped() -> None:
    new = FakeClient()
    buffer = publish_buffer(FakeClient())
    for pid in range(1, 11):
        await buffer.add(pid, b"m")
    buffer.suspend()
    blocked = asyncio.create_task(buffer.add(11, b"m"))
    await asyncio.sleep(0.01)
    assert not blocked.done()  # back-pressure: max_in_flight reached
    buffer.resume(new, 1)
    confirm(buffer, *range(1, 11))
    await asyncio.wait_for(blocked, 1)
    buffer._flush()
    assert new.ids_written() == list(range(1, 12))


async def test_a_write_on_a_closed_connection_suspends_instead_of_raising() -> None:
    lost: list[str] = []
    client = FakeClient()
    buffer = publish_buffer(client, lost)
    client._conn = None  # rstream sets it to None when it closes
    await buffer.add(1, b"a")
    await buffer.add(2, b"b")  # a full batch: written, fails, suspends
    assert buffer.suspended and buffer.in_flight == 2 and lost


def test_one_back_off_rule_for_every_loop() -> None:
    import random

    from smartclient.core.retry import Backoff, RetryPolicy
    from smartclient.mqtt.fleet import RECONNECT

    rule = Backoff(0.1, 2.0, 1.0)
    assert [rule.delay(n) for n in range(6)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0]
    spread = Backoff(1.0, 1.0, 1.0, jitter=0.2)
    assert all(0.8 <= spread.delay(1, random.Random(i)) <= 1.2 for i in range(50))
    assert RetryPolicy(backoff_jitter=0).backoff(3) == RetryPolicy(backoff_jitter=0).backoff_rule.delay(3) == 0.2
    assert RecoveryPolicy(jitter=0).next_delay(2, 0.0) == RecoveryPolicy(jitter=0).backoff_rule.delay(2)
    assert RECONNECT.max == 5.0 and RECONNECT.jitter == 0.2
    with pytest.raises(ConfigurationError):
        Backoff(initial=2.0, max=1.0)


async def test_frame_timing_records_drop_refused_frames_and_restart_after_a_recovery() -> None:
    """The per-frame records that time publish-to-confirm never outlive their frames: a refused frame's go,
    a recovery starts them afresh (their confirms would time the outage), and confirms that never come
    cannot make them grow past a bound."""
    timed: list[list[int]] = []
    client = FakeClient()
    buffer = PublishBuffer(client, 0, "s", BatchingPolicy(batch_size=2, linger=0.001, max_in_flight=10),
                           on_confirmed=lambda now, frames: timed.append([f[0] for f in frames]))
    for pid in range(1, 5):
        await buffer.add(pid, b"x")
    buffer._flush()
    assert [f[0] for f in buffer._written] == [2, 4]
    error(buffer, 16, 1, 2)  # refused (not retriable): its frame is not a confirmed one
    assert [f[0] for f in buffer._written] == [4]
    buffer.suspend()
    assert buffer.resume(FakeClient(), 1) == 2 and [f[0] for f in buffer._written] == [4]  # written again
    assert buffer._written is not None and buffer._written.maxlen is not None and buffer._written.maxlen <= 4096
    confirm(buffer, 3, 4)
    assert timed == [[4]] and not buffer._written


def test_a_producer_without_metrics_or_a_confirm_timeout_makes_no_deque() -> None:
    """Each is 760 bytes before it holds anything: at a few hundred producers, made only when needed (issue 57)."""
    buffer = PublishBuffer(FakeClient(), 0, "s", BatchingPolicy())
    assert (buffer._written, buffer._marks) == (None, None)
    assert not any(isinstance(getattr(buffer, name, None), deque) for name in dir(buffer))


def test_a_consumer_and_a_publish_buffer_keep_no_dict() -> None:
    """Hundreds of them in a process (a super stream's partitions): a dict each was 1.3 to 1.5 KiB (issue 57)."""
    from smartclient.stream.consumer import Consumer

    assert not hasattr(Consumer(None, None, "s", None), "__dict__")  # type: ignore[arg-type]
    assert not hasattr(PublishBuffer(FakeClient(), 0, "s", BatchingPolicy()), "__dict__")
