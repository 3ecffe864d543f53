"""Every message as promised when the application's own code fails (issue 29), against the test bed:

* a callback that raises is ``on_error``'s decision: ``"skip"`` goes on with the next message (or chunk) and counts
  it, ``"stop"`` stops there with a typed failure, and a restart from the stored offset resumes at that message;
* a failover never cancels a handler: the chunk it holds is finished, and recovery resumes after it, for
  per-message and per-chunk consumers, sync and async, plain, tracked and single active: no duplicate, no gap.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from smartclient import CallbackFailed, Chunk, ConfigurationError, ConsumerOptions, Environment, OffsetTracking
from smartclient.sync import SyncEnvironment
from smartclient.testing import TestBed

from ..conftest import wait_until, wait_until_sync
from .conftest import numbered, publish

COUNT = 10_000
BAD = 6_789  # the one message the callback raises on


class Seen:
    """What a consumer's handler got, by offset; ``kind`` is message or chunk, sync or async; it raises on
    ``bad`` (a message, or the chunk that holds it)."""

    def __init__(self, kind: str, bad: int | None = None) -> None:
        self.kind, self.bad = kind, bad
        self.offsets: Counter[int] = Counter()
        self.calls = 0

    def _take(self, offsets: list[int]) -> None:
        self.calls += 1
        if self.bad in offsets:
            raise ValueError(f"the application cannot handle offset {self.bad}")
        self.offsets.update(offsets)

    def handler(self) -> dict[str, Any]:
        if self.kind == "message-sync":
            return {"callback": lambda message, context: self._take([context.offset])}
        if self.kind == "chunk-sync":
            return {"on_chunk": lambda chunk: self._take(list(chunk.offsets))}
        if self.kind == "message-async":
            async def on_message(message: bytes, context: Any) -> None:
                self._take([context.offset])
            return {"callback": on_message}

        async def on_chunk(chunk: Chunk) -> None:
            self._take(list(chunk.offsets))
        return {"on_chunk": on_chunk}

    def once_each(self) -> bool:
        return all(n == 1 for n in self.offsets.values())


KINDS = ["message-sync", "message-async", "chunk-sync", "chunk-async"]


@pytest.mark.parametrize("kind", KINDS)
async def test_skip_goes_on_with_the_next_message_and_counts_the_one_that_raised(
    env: Environment, stream: str, kind: str
) -> None:
    await publish(env, stream, numbered(COUNT))
    seen = Seen(kind, bad=BAD)
    consumer = await env.consumer(stream, **seen.handler(), offset="first", on_error="skip")
    await wait_until(lambda: consumer.last_offset == COUNT - 1, 30, "the last message")
    assert consumer.callback_errors == 1 and consumer.failure is None and seen.once_each()
    missing = set(range(COUNT)) - set(seen.offsets)
    if kind.startswith("message"):
        assert missing == {BAD}  # 9,999 handled once each, 1 counted
    else:  # the chunk that held it, skipped as a whole
        assert BAD in missing and missing == set(range(min(missing), max(missing) + 1))
    await consumer.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_stop_is_a_typed_failure_and_a_restart_from_the_stored_offset_resumes_at_the_failing_message(
    env: Environment, stream: str, kind: str
) -> None:
    await publish(env, stream, numbered(COUNT))
    seen = Seen(kind, bad=BAD)
    consumer = await env.consumer(stream, **seen.handler(), offset="first", name="c",
                                  tracking=OffsetTracking(every=1000))  # on_error="stop": the default
    await wait_until(lambda: consumer.closed, 30, "the consumer to stop")
    failure = consumer.failure
    assert isinstance(failure, CallbackFailed) and failure.stream == stream
    assert isinstance(failure.__cause__, ValueError)
    calls = seen.calls
    stored = await env.stored_offset(stream, "c")
    assert stored is not None and stored < BAD and failure.offset is not None and stored == failure.offset - 1
    assert failure.offset == (BAD if kind.startswith("message") else failure.offset)
    assert failure.offset <= BAD and set(seen.offsets) == set(range(failure.offset))  # nothing after it
    assert seen.calls == calls  # and nothing handed over once it stopped
    again = Seen(kind)
    restarted = await env.consumer(stream, **again.handler(), offset=stored + 1, name="c")
    await wait_until(lambda: max(again.offsets, default=0) == COUNT - 1, 30, "the rest after a restart")
    assert min(again.offsets) == failure.offset and again.once_each()
    await restarted.close()


async def test_on_error_as_a_function_decides_per_message(env: Environment, stream: str) -> None:
    await publish(env, stream, numbered(100))
    dead_letters: list[int] = []

    def on_error(exc: Exception, context: Any) -> str:
        dead_letters.append(context.offset)
        return "skip" if context.offset < 50 else "stop"

    def callback(message: bytes, context: Any) -> None:
        if context.offset % 10 == 9:
            raise KeyError(context.offset)

    consumer = await env.consumer(stream, callback, offset="first", on_error=on_error)
    await wait_until(lambda: consumer.closed, 20, "the consumer to stop at offset 59")
    assert dead_letters == [9, 19, 29, 39, 49, 59] and consumer.callback_errors == 5
    assert isinstance(consumer.failure, CallbackFailed) and consumer.failure.offset == 59
    assert consumer.last_offset == 58


async def test_bad_on_error_is_refused_before_any_io(env: Environment, stream: str) -> None:
    for bad in ("ignore", 3, None):
        with pytest.raises(ConfigurationError, match="on_error"):
            await env.consumer(stream, lambda m, c: None, on_error=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_error"):
        await env.super_stream_consumer("no-such-super-stream", lambda m, c: None,
                                        options=ConsumerOptions(on_error="retry"))  # type: ignore[arg-type]


def test_the_sync_facade_skips_and_stops_the_same_way(rabbitmq_testbed: TestBed, rabbitmq_unique_name: str) -> None:
    node = rabbitmq_testbed.nodes[0]
    with SyncEnvironment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        env.create_stream(rabbitmq_unique_name)
        try:
            env.producer(rabbitmq_unique_name).send_batch([b"%d" % i for i in range(20)])
            skip, stop = Seen("message-sync", bad=7), Seen("message-sync", bad=7)
            skipping = env.consumer(rabbitmq_unique_name, **skip.handler(), offset="first", on_error="skip")
            stopping = env.consumer(rabbitmq_unique_name, **stop.handler(), offset="first")
            wait_until_sync(lambda: len(skip.offsets) == 19 and stopping.closed, 20, "both consumers")
            assert skipping.callback_errors == 1 and set(stop.offsets) == set(range(7))
            assert isinstance(stopping.failure, CallbackFailed) and stopping.failure.offset == 7
            skipping.close()
        finally:
            env.delete_stream(rabbitmq_unique_name)


# -- a failover while an async handler holds its chunk ----------------------------------------------------
class Holding(Seen):
    """Records every offset; the first time it is handed offset ``hold`` (or a chunk with it), it waits for
    ``release`` in the middle of its work: the fault comes then."""

    def __init__(self, kind: str, hold: int) -> None:
        super().__init__(kind)
        self.hold = hold
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0
        self.cut: Callable[[], None] | None = None  # closes the consumer's connection (sync handlers call it)

    async def _wait(self, offsets: list[int]) -> None:
        if self.hold in offsets and not self.holding.is_set():
            self.holding.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

    def _cut_here(self, offsets: list[int]) -> None:  # a sync handler: the connection is closed while it runs
        if self.hold in offsets and not self.holding.is_set():
            self.holding.set()
            assert self.cut is not None
            closing = threading.Thread(target=self.cut)
            closing.start()
            closing.join(10)

    def handler(self) -> dict[str, Any]:
        if self.kind == "message-sync":
            def on_message_sync(message: bytes, context: Any) -> None:
                self._cut_here([context.offset])
                self.offsets[context.offset] += 1
            return {"callback": on_message_sync}
        if self.kind == "chunk-sync":
            def on_chunk_sync(chunk: Chunk) -> None:
                self.offsets.update(chunk.offsets[:10])
                self._cut_here(list(chunk.offsets))
                self.offsets.update(chunk.offsets[10:])
            return {"on_chunk": on_chunk_sync}
        if self.kind == "message-async":
            async def on_message(message: bytes, context: Any) -> None:
                await self._wait([context.offset])
                self.offsets[context.offset] += 1
            return {"callback": on_message}

        async def on_chunk(chunk: Chunk) -> None:
            self.offsets.update(chunk.offsets[:10])
            await self._wait(list(chunk.offsets))  # part of the chunk done, the rest after the wait
            self.offsets.update(chunk.offsets[10:])
        return {"on_chunk": on_chunk}


@pytest.mark.faults
# every pair of (message or chunk, async or sync, consumer mode) once: 6 cases, not the 12 of every triple
@pytest.mark.parametrize("kind, mode", [("message-async", "plain"), ("chunk-sync", "plain"),
                                        ("message-sync", "tracked"), ("chunk-async", "tracked"),
                                        ("chunk-async", "single-active"), ("message-sync", "single-active")])
async def test_a_failover_never_cancels_a_handler_and_recovery_resumes_after_its_chunk(
    rabbitmq_faulty_testbed: TestBed, env: Environment, stream: str, kind: str, mode: str
) -> None:
    bed = rabbitmq_faulty_testbed
    total = 3000
    seen = Holding(kind, hold=1234)
    options: dict[str, Any] = {"plain": {}, "tracked": {"name": "c", "tracking": OffsetTracking(every=100)},
                               "single-active": {"name": "c", "single_active": True}}[mode]
    consumer = await env.consumer(stream, **seen.handler(), offset="first", **options)
    record = consumer.placement
    assert record is not None
    server_name = await asyncio.to_thread(bed.connection_named, record.connection)
    seen.cut = lambda: bed.close_connection(server_name)
    await publish(env, stream, numbered(total))  # (once the cut is ready: a sync handler makes it itself)
    await asyncio.wait_for(seen.holding.wait(), 30)
    if kind.endswith("async"):
        await asyncio.to_thread(bed.close_connection, server_name)  # while the handler holds its chunk
        await wait_until(lambda: consumer.recovering, 20, "the consumer to start recovering")
        seen.release.set()
    await wait_until(lambda: len(seen.offsets) == total, 30, lambda: f"{total} offsets, got {len(seen.offsets)}")
    await wait_until(lambda: consumer.recoveries >= 1, 20, "the recovery to end")
    assert seen.cancelled == 0
    assert set(seen.offsets) == set(range(total)), "a gap"
    assert seen.once_each(), f"duplicates: {sum(n - 1 for n in seen.offsets.values())}"
    assert consumer.redelivered == 0
    await consumer.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_consumer_closed_from_its_own_callback_closes_at_once_and_hands_nothing_after(
    env: Environment, stream: str, kind: str
) -> None:
    await publish(env, stream, numbered(1000))
    seen, closed = Seen(kind), asyncio.Event()
    holder: list[Any] = []
    inner = seen.handler()
    (option, function), = inner.items()

    async def close_at_500(*args: Any) -> None:  # the application's handler closes its own consumer
        offsets = [args[1].offset] if option == "callback" else list(args[0].offsets)
        if closed.is_set():
            seen.offsets.update(o + 1_000_000 for o in offsets)  # handed after close: fails below
            return
        result = function(*args)
        if result is not None:
            await result
        if 500 in offsets:
            # (delivery starts before env.consumer() returns: on a loaded machine offset 500 may come first)
            await asyncio.wait_for(registered.wait(), 10)
            await asyncio.wait_for(holder[0].close(), 10)  # returns: it does not wait for this very callback
            closed.set()

    registered = asyncio.Event()
    holder.append(await env.consumer(stream, **{option: close_at_500}, offset="first"))
    registered.set()
    await asyncio.wait_for(closed.wait(), 20)
    assert holder[0].closed and max(seen.offsets) < 1_000_000 and seen.once_each()


async def test_a_tracked_consumer_closed_while_its_callback_holds_a_chunk_stores_what_it_handled(
    env: Environment, stream: str
) -> None:
    await publish(env, stream, numbered(3000))
    seen = Holding("chunk-async", hold=1234)
    consumer = await env.consumer(stream, **seen.handler(), offset="first", name="c",
                                  tracking=OffsetTracking(every=100_000))  # stored only on close
    await asyncio.wait_for(seen.holding.wait(), 20)
    closing = asyncio.ensure_future(consumer.close())
    await asyncio.sleep(0.2)  # the scenario: close waits while the callback still holds its chunk
    assert not closing.done()
    seen.release.set()
    await asyncio.wait_for(closing, 20)
    stored = await env.stored_offset(stream, "c")
    assert stored == max(seen.offsets)  # the whole chunk it handled: a restart repeats nothing
