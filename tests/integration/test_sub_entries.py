"""Sub-entries (``Producer.send_sub_entry``) against the test bed: stored as one entry, read as separate messages
with consecutive offsets, deduplicated as a whole, readable by an AMQP 0.9.1 consumer when uncompressed."""

from __future__ import annotations

import time

import pytest

from smartclient import ConfigurationError, Environment, PublishingIdNotIncreasing
from smartclient.amqp.placement import AmqpPlacer
from smartclient.amqp.streams import AmqpStreamConsumer, StreamDelivery
from smartclient.stream import _rstream
from smartclient.testing import TestBed

from ..conftest import wait_until


@pytest.mark.parametrize("compression", ["none", "gzip"])
async def test_sub_entries_are_read_as_their_messages_in_order_and_a_replay_is_dropped_whole(
    env: Environment, stream: str, compression: str
) -> None:
    producer = await env.producer(stream, name="batches")
    await producer.send_sub_entry([b"a0", b"a1", b"a2"], compression=compression)
    await producer.send(b"plain")
    await producer.send_sub_entry([b"b%d" % i for i in range(500)], compression=compression)
    await producer.flush()
    assert producer.buffer is not None and producer.buffer.confirmed == 504  # messages, not entries
    stored = producer.last_publishing_id
    await producer.close()
    again = await env.producer(stream, name="batches")
    assert again.last_publishing_id == 3  # three publishing ids: two sub-entries and a message
    await again.send_sub_entry([b"a0", b"a1", b"a2"], publishing_id=1)  # a replayed sub-entry: confirmed, dropped
    await again.flush()
    with pytest.raises(PublishingIdNotIncreasing):
        await again.send_sub_entry([b"x"], publishing_id=1)
    with pytest.raises(ConfigurationError, match="1 to 65535"):
        await again.send_sub_entry([])
    await again.close()
    expected = [b"a0", b"a1", b"a2", b"plain", *[b"b%d" % i for i in range(500)]]
    per_message: list[tuple[int, bytes]] = []
    per_chunk: list[tuple[int, bytes]] = []
    first = await env.consumer(stream, lambda m, c: per_message.append((c.offset, m)), offset="first")
    second = await env.consumer(stream, on_chunk=lambda chunk: per_chunk.extend(chunk), offset="first")
    await wait_until(lambda: len(per_message) >= 504 and len(per_chunk) >= 504, 10, "504 messages, twice")
    for got in (per_message, per_chunk):
        assert [m for _, m in got] == expected  # nothing twice: the replay was dropped
        assert [o for o, _ in got] == list(range(504))  # each message its own offset
    await first.close()
    await second.close()
    assert stored == 0  # a new name had nothing stored


def test_an_amqp_consumer_reads_the_messages_of_an_uncompressed_sub_entry(
    rabbitmq_testbed: TestBed, placer: AmqpPlacer, rabbitmq_unique_name: str
) -> None:
    import asyncio

    async def publish() -> None:
        node = rabbitmq_testbed.nodes[0]
        async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
            await env.create_stream(rabbitmq_unique_name)
            producer = await env.producer(rabbitmq_unique_name)
            await producer.send_sub_entry([_rstream.amqp_message(b"m%d" % i, None) for i in range(5)])
            await producer.flush()

    asyncio.run(publish())
    got: list[StreamDelivery] = []
    try:
        with AmqpStreamConsumer(placer, rabbitmq_unique_name, got.append, offset="first", prefetch=10) as consumer:
            deadline = time.monotonic() + 10
            while len(got) < 5 and time.monotonic() < deadline:
                consumer.poll(0.1)
        assert [d.body for d in got] == [b"m%d" % i for i in range(5)]
        assert [d.offset for d in got] == list(range(5))
    finally:
        with rabbitmq_testbed.management() as api:
            api.delete(f"/api/queues/%2F/{rabbitmq_unique_name}")
