"""The chunk-level consumer (``env.consumer(stream, on_chunk=...)``) against the test bed: every offset once and
in order, a start in the middle of a chunk, decoding on demand, offset tracking, single active consumer,
filtering, super streams, an async handler.  Recovery without a gap is in test_recovery_faults.py (both modes)."""

from __future__ import annotations

import itertools
from typing import Any

from smartclient import Chunk, Environment, OffsetTracking, StreamArguments, StreamFilter
from smartclient.stream import _rstream

from ..conftest import wait_until
from .conftest import numbered, publish


def increasing(values: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


class Chunks:
    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.items: list[tuple[int, bytes]] = []

    def __call__(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        self.items.extend(chunk)

    async def wait_for(self, count: int) -> None:
        await wait_until(lambda: len(self.items) >= count, 20, f"{count} messages in chunks")


async def test_every_offset_once_in_order_a_chunk_at_a_time_from_first_and_from_the_middle_of_a_chunk(
    env: Environment, stream: str
) -> None:
    await publish(env, stream, numbered(2000))
    whole = Chunks()
    consumer = await env.consumer(stream, on_chunk=whole, offset="first")
    await whole.wait_for(2000)
    assert whole.items == [(i, b"%d" % i) for i in range(2000)]
    assert 1 < len(whole.chunks) < 2000 and all(len(c) == len(c.bodies) == len(c.offsets) for c in whole.chunks)
    assert consumer.last_offset == 1999
    await consumer.close()
    inside = next(c for c in whole.chunks if len(c) > 2)  # a start two messages into a chunk
    middle = Chunks()
    consumer = await env.consumer(stream, on_chunk=middle, offset=inside.first_offset + 2)
    await middle.wait_for(2000 - inside.first_offset - 2)
    assert middle.items[0][0] == inside.first_offset + 2  # nothing before the offset asked for
    assert [o for o, _ in middle.items] == list(range(inside.first_offset + 2, 2000))
    await consumer.close()


async def test_bodies_decode_as_amqp_messages_on_demand_and_an_async_handler_is_awaited(
    env: Environment, stream: str
) -> None:
    producer = await env.producer(stream)
    for i in range(3):
        await producer.send(_rstream.amqp_message(b"body-%d" % i, {"n": i}))
    await producer.flush()
    got: list[Any] = []

    async def on_chunk(chunk: Chunk) -> None:
        got.extend(chunk.messages())

    consumer = await env.consumer(stream, on_chunk=on_chunk, offset="first")
    await wait_until(lambda: len(got) == 3, 10, "3 AMQP messages")
    assert [bytes(m.body) for m in got] == [b"body-0", b"body-1", b"body-2"]
    assert [m.application_properties[b"n"] for m in got] == [0, 1, 2]
    await consumer.close()


async def test_tracking_stores_the_last_offset_of_each_chunk_and_a_restart_resumes_after_it(
    env: Environment, stream: str
) -> None:
    await publish(env, stream, numbered(1000))
    first = Chunks()
    consumer = await env.consumer(stream, on_chunk=first, offset="first", name="chunks",
                                  tracking=OffsetTracking(every=100, interval=None))
    await first.wait_for(1000)
    await wait_until(lambda: consumer._stored == 999, 10, "the offset of the last chunk stored")
    await consumer.close()
    assert await env.stored_offset(stream, "chunks") == 999
    await publish(env, stream, numbered(500, 1000))
    again = Chunks()
    consumer = await env.consumer(stream, on_chunk=again, offset="first", name="chunks",
                                  tracking=OffsetTracking(every=100, interval=None), single_active=True)
    await again.wait_for(500)
    # after the stored offset: no gap, no repeat (a stored offset takes an offset of the stream's own: the
    # offsets and the bodies part ways once one is stored)
    assert [body for _, body in again.items] == [b"%d" % i for i in range(1000, 1500)]
    assert again.items[0][0] > 999 and increasing([offset for offset, _ in again.items])
    await consumer.close()


async def test_single_active_chunk_consumers_fail_over_after_the_stored_offset(env: Environment, stream: str) -> None:
    tracking = OffsetTracking(every=1, interval=None)
    handlers = {"a": Chunks(), "b": Chunks()}
    a = await env.consumer(stream, on_chunk=handlers["a"], offset="first", name="sac", single_active=True,
                           tracking=tracking)
    b = await env.consumer(stream, on_chunk=handlers["b"], offset="first", name="sac", single_active=True,
                           tracking=tracking)
    await wait_until(lambda: a.active is not None and b.active is not None, 10, "both to hear whether they are active")
    await publish(env, stream, numbered(600))
    await wait_until(lambda: len(handlers["a"].items) + len(handlers["b"].items) == 600, 10, "600 messages")
    active, standby, key = (a, b, "b") if handlers["a"].items else (b, a, "a")
    assert handlers[key].items == []  # one instance at a time
    await active.close()
    await wait_until(lambda: standby.active is True, 10, "the standby to become active")
    await publish(env, stream, numbered(300, 600))
    await handlers[key].wait_for(300)
    got = handlers[key].items
    assert [body for _, body in got] == [b"%d" % i for i in range(600, 900)]  # no gap, no duplicate
    assert increasing([offset for offset, _ in got])
    await standby.close()


async def test_a_filtered_chunk_holds_only_the_matching_messages_with_their_offsets(
    env: Environment, rabbitmq_unique_name: str
) -> None:
    await env.create_stream(rabbitmq_unique_name, StreamArguments(filter_size_bytes=32))
    try:
        producer = await env.producer(rabbitmq_unique_name, filter_value=lambda body: body.decode().split(":")[0])
        await producer.send_batch([b"a:0", b"b:1", b"a:2", b"b:3"])
        await producer.send_wait(b"b:end")
        got = Chunks()
        consumer = await env.consumer(rabbitmq_unique_name, on_chunk=got, offset="first",
                                      filter=StreamFilter(["b"], post_filter=lambda m: bytes(m).startswith(b"b:")))
        await wait_until(lambda: any(body == b"b:end" for _, body in got.items), 10, "the last message")
        assert [body for _, body in got.items] == [b"b:1", b"b:3", b"b:end"]
        assert [offset for offset, _ in got.items] == [1, 3, 4]
        await consumer.close()
    finally:
        await env.delete_stream(rabbitmq_unique_name)


async def test_a_super_stream_chunk_consumer_reads_every_partition(env: Environment, rabbitmq_unique_name: str) -> None:
    partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        producer = await env.super_stream_producer(rabbitmq_unique_name, key=lambda body: body.decode())
        await producer.send_batch([b"key-%d" % i for i in range(60)])
        got = Chunks()
        consumer = await env.super_stream_consumer(rabbitmq_unique_name, on_chunk=got, offset="first")
        await got.wait_for(60)
        assert sorted(body for _, body in got.items) == sorted(b"key-%d" % i for i in range(60))
        assert {chunk.stream for chunk in got.chunks} == set(partitions)
        await consumer.close()
    finally:
        await env.delete_super_stream(rabbitmq_unique_name)
