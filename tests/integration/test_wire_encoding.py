"""What is on the wire (issue 29, item 3), against the test bed: every other client reads what smartclient's
producers write by default (AMQP 1.0, one data section per body): pika over AMQP 0.9.1, rstream's AMQP 1.0
decoder, the AMQP 1.0 client (rabbitmq-amqp-python-client); smartclient reads what each of them writes, per
message and per chunk; ``encoding="raw"`` keeps the bytes alone, which closes a pika consumer's connection."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker
from rstream import AMQPMessage, Consumer, Producer, amqp_decoder

from smartclient import Chunk, Environment, MessageDecodeError
from smartclient.stream.codec import decode_amqp
from smartclient.sync import SyncEnvironment
from smartclient.testing import TestBed

from ..conftest import wait_until, wait_until_sync

PROPERTIES = {"colour": "blue", "n": 3}


async def write_every_way(env: Environment, stream: str) -> list[tuple[bytes, dict[str, Any]]]:
    """Every publishing call of a default producer, short and long bodies, a sub-entry, and an AMQPMessage with
    application properties; returns what each message should read as: (body, application properties)."""
    producer = await env.producer(stream)
    assert producer.encoding == "amqp"
    await producer.send(b"send")
    await producer.send(b"L" * 300)  # vbin32
    await producer.send(b"")
    await producer.send_many([b"many-0", b"many-1", b"M" * 1000])
    submitted = await producer.submit(b"submit")
    await producer.send_wait(b"send_wait")
    await producer.send_batch([b"batch-0", b"batch-1"])
    await producer.send_sub_entry([b"sub-0", b"sub-1"])
    await producer.send(AMQPMessage(body=b"props", application_properties=PROPERTIES))
    await producer.flush()
    assert (await submitted).confirmed
    await producer.close()
    bodies = [b"send", b"L" * 300, b"", b"many-0", b"many-1", b"M" * 1000, b"submit", b"send_wait", b"batch-0",
              b"batch-1", b"sub-0", b"sub-1"]
    return [(body, {}) for body in bodies] + [(b"props", PROPERTIES)]


# -- the other clients ----------------------------------------------------------------------------------------
def pika_read(bed: TestBed, stream: str, count: int) -> list[tuple[bytes, dict[str, Any]]]:
    """An AMQP 0.9.1 stream consumer from the first offset (basic.qos prefetch, each message acked): the body
    and headers (application properties) of ``count`` messages; the connection must still be open."""
    node = bed.nodes[0]
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        node.host, node.amqp_port, credentials=pika.PlainCredentials(bed.username, bed.password)))
    got: list[tuple[bytes, dict[str, Any]]] = []
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=5)

        def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            headers = {k: v for k, v in (properties.headers or {}).items() if k != "x-stream-offset"}
            got.append((body, headers))
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 15
        while len(got) < count and time.monotonic() < deadline:
            connection.process_data_events(0.1)
        connection.process_data_events(0.3)  # anything more, or a close, shows now
        assert connection.is_open, "the broker closed pika's connection"
    finally:
        if connection.is_open:
            connection.close()
    return got


async def rstream_read(bed: TestBed, stream: str, count: int) -> list[tuple[bytes, dict[str, Any]]]:
    """rstream's consumer with its AMQP 1.0 decoder (amqp_decoder), from the first offset."""
    node = bed.nodes[0]
    got: list[tuple[bytes, dict[str, Any]]] = []

    def on_message(message: AMQPMessage, context: Any) -> None:
        got.append((bytes(message.body), _text_keys(message.application_properties)))

    async with Consumer(node.host, node.stream_port, username=bed.username, password=bed.password) as consumer:
        await consumer.start()
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder)
        await wait_until(lambda: len(got) >= count, 15, lambda: f"{count} messages through rstream ({len(got)})")
    return got


class _Enough(Exception):
    """Raised by an AMQP 1.0 handler to end the client's ``run()`` with its connection still usable (its own
    ``stop()`` ends the I/O too, so closing then times out)."""


def amqp10_read(bed: TestBed, stream: str, count: int) -> list[tuple[bytes, dict[str, Any]]]:
    """The AMQP 1.0 client (rabbitmq-amqp-python-client) on a node's AMQP port, from the first offset (a stream
    needs an offset filter: ``first``)."""
    amqp10 = pytest.importorskip("rabbitmq_amqp_python_client",
                                 reason="the AMQP 1.0 client is not installed: pip install smartclient[amqp10]")
    node = bed.nodes[0]
    got: list[tuple[bytes, dict[str, Any]]] = []

    class Handler(amqp10.AMQPMessagingHandler):  # type: ignore[misc]
        def on_amqp_message(self, event: Any) -> None:
            message = event.message
            body = message.body
            got.append((bytes(body) if body is not None else b"", _text_keys(message.application_properties)))
            self.delivery_context.accept(event)
            if len(got) >= count:
                raise _Enough

    environment = amqp10.Environment(f"amqp://{bed.username}:{bed.password}@{node.host}:{node.amqp_port}/")
    try:
        connection = environment.connection()
        connection.dial()
        consumer = connection.consumer(
            amqp10.AddressHelper.queue_address(stream), message_handler=Handler(),
            consumer_options=amqp10.StreamConsumerOptions(offset_specification=amqp10.OffsetSpecification.first))
        timer = threading.Timer(15, consumer.stop)  # the wait's bound, if fewer messages come
        timer.start()
        try:
            consumer.run()
        except _Enough:
            pass
        finally:
            timer.cancel()
        assert len(got) >= count, f"{count} messages over AMQP 1.0 ({len(got)} in 15 s)"
        consumer.close()
    finally:
        environment.close()
    return got


def _text_keys(properties: dict[Any, Any] | None) -> dict[str, Any]:
    out = {}
    for key, value in (properties or {}).items():
        key = key.decode() if isinstance(key, bytes) else str(key)
        value = value.decode() if isinstance(value, bytes) else value
        out[key] = int(value) if isinstance(value, int) and not isinstance(value, bool) else value
    return out


# -- smartclient --------------------------------------------------------------------------------------------------
async def smartclient_read(env: Environment, stream: str, count: int) -> tuple[list[bytes], list[Chunk]]:
    """Per message (what the callback is handed) and per chunk (the chunks)."""
    handed: list[bytes] = []
    chunks: list[Chunk] = []
    per_message = await env.consumer(stream, lambda message, context: handed.append(message), offset="first")
    per_chunk = await env.consumer(stream, on_chunk=chunks.append, offset="first")
    await wait_until(lambda: len(handed) >= count and sum(map(len, chunks)) >= count, 15,
                     lambda: f"{count} messages each way ({len(handed)}, {sum(map(len, chunks))})")
    await per_message.close()
    await per_chunk.close()
    return handed, chunks


def decoded(chunks: list[Chunk]) -> list[tuple[bytes, dict[str, Any]]]:
    out = []
    for chunk in chunks:
        for message in chunk.messages():
            body = message.body
            out.append((b"".join(map(bytes, body)) if isinstance(body, list) else bytes(body or b""),
                        _text_keys(message.application_properties)))
    return out


async def test_pika_rstream_and_the_amqp10_client_read_what_smartclient_wrote_and_so_does_smartclient(
    env: Environment, stream: str, rabbitmq_testbed: TestBed
) -> None:
    expected = await write_every_way(env, stream)
    count = len(expected)
    assert await asyncio.to_thread(pika_read, rabbitmq_testbed, stream, count) == expected
    assert await rstream_read(rabbitmq_testbed, stream, count) == expected
    assert await asyncio.to_thread(amqp10_read, rabbitmq_testbed, stream, count) == expected
    handed, chunks = await smartclient_read(env, stream, count)
    whole = bytes(AMQPMessage(body=b"props", application_properties=PROPERTIES))
    bodies = [body for body, _ in expected[:-1]]
    assert handed == [*bodies, whole]  # the bodies as sent; an AMQP 1.0 message with properties, whole
    assert [body for chunk in chunks for body in chunk.bodies] == handed
    assert decoded(chunks) == expected


async def test_smartclient_reads_what_pika_rstream_and_the_amqp10_client_wrote(
    env: Environment, stream: str, rabbitmq_testbed: TestBed
) -> None:
    node = rabbitmq_testbed.nodes[0]

    def pika_publish() -> None:
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            node.host, node.amqp_port,
            credentials=pika.PlainCredentials(rabbitmq_testbed.username, rabbitmq_testbed.password)))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", stream, b"pika-0")
        channel.basic_publish("", stream, b"pika-1", pika.BasicProperties(headers={"colour": "red", "n": 1}))
        connection.close()

    def amqp10_publish() -> None:
        amqp10 = pytest.importorskip("rabbitmq_amqp_python_client")
        environment = amqp10.Environment(
            f"amqp://{rabbitmq_testbed.username}:{rabbitmq_testbed.password}@{node.host}:{node.amqp_port}/")
        try:
            connection = environment.connection()
            connection.dial()
            publisher = connection.publisher(amqp10.AddressHelper.queue_address(stream))
            publisher.publish(amqp10.Message(body=b"amqp10-0"))
            publisher.publish(amqp10.Message(body=b"amqp10-1", application_properties={"colour": "green", "n": 2}))
            publisher.close()
        finally:
            environment.close()

    await asyncio.to_thread(pika_publish)
    async with Producer(node.host, node.stream_port, username=rabbitmq_testbed.username,
                        password=rabbitmq_testbed.password) as producer:
        await producer.send_wait(stream, AMQPMessage(body=b"rstream-0"))
        await producer.send_wait(stream, AMQPMessage(body=b"rstream-1",
                                                     application_properties={"colour": "blue", "n": 3}))
    await asyncio.to_thread(amqp10_publish)
    expected = [(b"pika-0", {}), (b"pika-1", {"colour": "red", "n": 1}), (b"rstream-0", {}),
                (b"rstream-1", {"colour": "blue", "n": 3}), (b"amqp10-0", {}),
                (b"amqp10-1", {"colour": "green", "n": 2})]
    handed, chunks = await smartclient_read(env, stream, len(expected))
    # per message: a bare data section as its body, any other AMQP 1.0 message whole (decode it to read it)
    assert [message if message == body else decode_amqp(message)[0] for message, (body, _) in
            zip(handed, expected, strict=True)] == [body for body, _ in expected]
    assert handed[2] == b"rstream-0"  # rstream's AMQPMessage(body=...) is exactly one data section
    assert [body for chunk in chunks for body in chunk.bodies] == handed
    assert decoded(chunks) == expected


async def test_a_raw_message_closes_a_pika_consumers_connection_and_chunk_messages_names_its_offset(
    env: Environment, stream: str, rabbitmq_testbed: TestBed
) -> None:
    """encoding="raw" is what smartclient wrote before: stream clients read the bytes; the broker cannot turn
    them into an AMQP 0.9.1 message and closes the consumer's connection (541 INTERNAL_ERROR)."""
    producer = await env.producer(stream)
    raw = await env.producer(stream, encoding="raw")
    await producer.send_wait(b"amqp-0")
    await raw.send_wait(b"raw-1")
    await producer.send_wait(b"amqp-2")
    await raw.send_sub_entry([b"raw-3", b"raw-4"])
    await raw.flush()
    handed, chunks = await smartclient_read(env, stream, 5)
    assert handed == [b"amqp-0", b"raw-1", b"amqp-2", b"raw-3", b"raw-4"]  # smartclient reads both
    stored = [m for chunk in chunks for m in chunk.stored]
    assert stored[1] == b"raw-1" and stored[0] == bytes(AMQPMessage(body=b"amqp-0"))
    failures: list[tuple[int | None, str]] = []
    for chunk in chunks:
        try:
            chunk.messages()
        except MessageDecodeError as exc:
            failures.append((exc.offset, exc.stream))
    assert failures and failures[0] == (1, stream)  # the first raw message of the chunk that holds it
    with pytest.raises(ConnectionClosedByBroker) as closed:
        await asyncio.to_thread(pika_read, rabbitmq_testbed, stream, 5)
    assert closed.value.reply_code == 541


def test_the_sync_facade_and_a_super_stream_producer_write_amqp_by_default_and_raw_when_asked(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    name = rabbitmq_unique_name
    with SyncEnvironment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        env.create_stream(name)
        try:
            producer = env.producer(name)
            producer.send(b"sync-0")
            producer.send_many([b"sync-1", b"S" * 400])
            producer.flush()
            producer.close()
            assert pika_read(rabbitmq_testbed, name, 3) == [(b"sync-0", {}), (b"sync-1", {}), (b"S" * 400, {})]
        finally:
            env.delete_stream(name)
        for encoding in ("amqp", "raw"):
            super_stream = f"{name}-{encoding}"
            partitions = env.create_super_stream(super_stream, partitions=2)
            try:
                options: dict[str, Any] = {} if encoding == "amqp" else {"encoding": "raw"}
                producer = env.super_stream_producer(super_stream, key=lambda body: body.decode(), **options)
                for i in range(10):
                    producer.send(b"k%d" % i)
                producer.flush()
                producer.close()
                chunks: list[Chunk] = []
                consumer = env.super_stream_consumer(super_stream, on_chunk=chunks.append, offset="first")
                wait_until_sync(lambda got=chunks: sum(map(len, got)) >= 10, 15, "10 messages of the super stream")
                consumer.close()
                assert sorted(b for chunk in chunks for b in chunk.bodies) == sorted(b"k%d" % i for i in range(10))
                stored = [m for chunk in chunks for m in chunk.stored]
                if encoding == "amqp":
                    assert sorted(stored) == sorted(bytes(AMQPMessage(body=b"k%d" % i)) for i in range(10))
                    for partition in partitions:  # pika reads each partition's messages
                        bodies = [b for chunk in chunks if chunk.stream == partition for b in chunk.bodies]
                        assert pika_read(rabbitmq_testbed, partition, len(bodies)) == [(b, {}) for b in bodies]
                else:
                    assert sorted(stored) == sorted(b"k%d" % i for i in range(10))
                    with pytest.raises(MessageDecodeError):
                        next(chunk for chunk in chunks if len(chunk)).messages()
            finally:
                env.delete_super_stream(super_stream, missing_ok=True)


def test_the_spark_sources_decode_reads_what_smartclient_wrote_and_names_a_raw_messages_offset(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    pytest.importorskip("pyspark")
    from smartclient.spark.config import StreamConnection
    from smartclient.spark.source import OffsetRange, _read

    node = rabbitmq_testbed.nodes[0]
    uri = rabbitmq_testbed.stream_uri(node.host, node.stream_port)
    name = rabbitmq_unique_name
    with SyncEnvironment(uri) as env:
        env.create_stream(name)
        try:
            producer, raw = env.producer(name), env.producer(name, encoding="raw")
            producer.send(b"plain")
            producer.send(AMQPMessage(body=b"props", application_properties=PROPERTIES))
            producer.flush()
            raw.send_wait(b"raw")
            connection = StreamConnection(uri=uri)

            def rows(batches: Any) -> list[tuple[Any, ...]]:  # (read() yields Arrow batches, Spark's schema)
                return [tuple(row.values()) for batch in batches for row in batch.to_pylist()]

            assert [row[3:] for row in rows(_read(connection, OffsetRange(name, 0, 2), decode=True))] == [
                (b"plain", None), (b"props", None)]  # a data section is decoded from the message as stored
            assert [row[3] for row in rows(_read(connection, OffsetRange(name, 0, 3)))] == [
                b"plain", bytes(AMQPMessage(body=b"props", application_properties=PROPERTIES)), b"raw"]
            with pytest.raises(MessageDecodeError, match="offset 2 of stream") as caught:
                list(_read(connection, OffsetRange(name, 0, 3), decode=True))
            assert (caught.value.stream, caught.value.offset) == (name, 2)
        finally:
            env.delete_stream(name)
