"""A callback that raises is the application's decision (on_error), never a silent loss; a chunk being handed over
is never cut when its delivery stops (issue 29).  The delivery loop and rstream's client, with no broker."""

from __future__ import annotations

import asyncio
from typing import Any

from smartclient.core.delivery import Chunk, ChunkHandler
from smartclient.stream._rstream.wire import NamedClient
from tests.unit.fakes import carrier, deliver, hand_over, simple, subscriber

TEN = [simple(b"m%d" % i) for i in range(10)]


def raising_at(*offsets: int) -> Any:
    def callback(message: Any, context: Any) -> None:
        if context.offset in offsets:
            raise ValueError(f"bad {context.offset}")

    return callback


def test_skip_goes_on_with_the_next_message_of_the_same_chunk() -> None:
    asked: list[tuple[str, int]] = []

    def decide(exc: Exception, context: Any) -> bool:
        asked.append((str(exc), context.offset))
        return True

    sub, credits = subscriber(raising_at(102, 107))
    consumer = carrier(on_error=decide)
    hand_over(consumer, deliver(TEN, records=10), sub)
    assert [c.offset for _, c in sub.handed] == list(range(100, 110))  # every one handed, none twice
    assert asked == [("bad 102", 102), ("bad 107", 107)]
    assert credits == ["credit after 0"] and sub.offset == 110  # the whole chunk is behind it
    assert consumer.smartclient_consumed["s"] == 10


def test_a_chunk_that_ends_after_its_consumer_was_released_counts_in_what_closed_subscriptions_left() -> None:
    from collections import Counter

    left = {"smartclient_consumed": Counter[str](), "smartclient_chunks": Counter[str]()}
    consumer = carrier()
    consumer.smartclient_left = left

    def release_meanwhile(message: Any, context: Any) -> None:
        consumer.smartclient_streams.discard("s")  # (its consumer closed from within the callback)

    sub, _ = subscriber(release_meanwhile)
    hand_over(consumer, deliver(TEN, records=10), sub)
    # the carrier keeps no count of a stream it no longer consumes (one key per stream ever consumed, for weeks)
    assert not consumer.smartclient_consumed and not consumer.smartclient_chunks
    assert left == {"smartclient_consumed": Counter(s=10), "smartclient_chunks": Counter(s=1)}


def test_skip_with_the_credit_part_way_still_gives_it_once() -> None:
    from smartclient.core.flow import ConsumerFlow

    sub, credits = subscriber(raising_at(100, 104, 105))
    hand_over(carrier(ConsumerFlow(credit_after=0.5), on_error=lambda exc, context: True), deliver(TEN, records=10),
              sub)
    assert [c.offset for _, c in sub.handed] == list(range(100, 110))
    assert credits == ["credit after 5"] and sub.offset == 110


def test_stop_hands_nothing_more_and_the_position_ends_before_the_failing_message() -> None:
    sub, _credits = subscriber(raising_at(103))
    consumer = carrier(on_error=lambda exc, context: False)
    hand_over(consumer, deliver(TEN, records=10), sub)
    assert [c.offset for _, c in sub.handed] == [100, 101, 102, 103]
    assert sub.offset == 103 and sub.smartclient_moved  # last_offset: 102
    assert 1 in sub.client.smartclient_stopping
    hand_over(consumer, deliver([simple(b"later")], records=1, first=110), sub)  # a chunk already on its way
    assert len(sub.handed) == 4 and consumer.smartclient_consumed["s"] == 3


def test_stop_at_the_first_message_leaves_no_position() -> None:
    sub, _ = subscriber(raising_at(100))
    hand_over(carrier(on_error=lambda exc, context: False), deliver(TEN, records=10), sub)
    assert sub.offset is None and not getattr(sub, "smartclient_moved", False)


def test_a_chunk_handler_is_skipped_or_stopped_as_a_whole() -> None:
    seen: list[Chunk] = []

    def handler(chunk: Chunk) -> None:
        seen.append(chunk)
        raise ValueError("the application's")

    for verdict, offset in ((True, 110), (False, None)):
        asked: list[Any] = []
        sub, credits = subscriber(None)
        sub.callback = ChunkHandler(handler)
        on_error = lambda exc, where, v=verdict, asked=asked: asked.append(where) or v  # noqa: E731
        hand_over(carrier(on_error=on_error), deliver(TEN, records=10), sub)
        assert asked == [seen[-1]] and credits == ["credit after 0"] and sub.offset == offset


def test_without_an_on_error_the_exception_goes_to_rstream_and_the_credit_still_goes() -> None:
    sub, credits = subscriber(raising_at(101))
    try:
        hand_over(carrier(), deliver(TEN, records=10), sub)
    except ValueError:
        pass
    else:
        raise AssertionError("the callback's exception was swallowed")
    assert credits == ["credit after 0"]


def test_stopping_a_delivery_task_waits_for_the_chunk_in_the_handler_and_never_cancels_it() -> None:
    async def scenario() -> list[str]:
        client = NamedClient(host="127.0.0.1", port=1, frame_max=1 << 20, heartbeat=60)
        events: list[str] = []
        release = asyncio.Event()

        async def delivery() -> None:
            handing = client.smartclient_handing[7] = asyncio.get_running_loop().create_future()
            try:
                await release.wait()  # the application's handler, in the middle of its chunk
                events.append("handler finished")
            except asyncio.CancelledError:
                events.append("handler cancelled")
                raise
            finally:
                del client.smartclient_handing[7]
                handing.set_result(None)
            await asyncio.Event().wait()  # the next chunk never comes

        client.start_task("run_delivery_handlers_7", delivery())
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(client.stop_queue_listener_task(7))
        await asyncio.sleep(0.05)
        assert not stopping.done() and 7 in client.smartclient_stopping  # waits; no chunk after this one
        release.set()
        await asyncio.wait_for(stopping, 5)
        events.append(f"stopped, still stopping: {7 in client.smartclient_stopping}")
        return events

    assert asyncio.run(scenario()) == ["handler finished", "stopped, still stopping: False"]
