"""Every call ends: closed handles refuse at once, deleted streams end their handles quietly, errors say what
happened, and producers and consumers share one connection per node (issue 15)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import (
    Address,
    Confirmation,
    Consumer,
    Environment,
    HandleClosed,
    Producer,
    Role,
    TopologyError,
)
from smartclient.stream.super_stream import SuperStreamConsumer, SuperStreamProducer
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, stream_members

from ..conftest import wait_until

# A value for every required parameter of a public method, by name.  A method with a parameter missing here
# fails the contract test with the name to add: the walk below cannot fall behind the public surface.
ARGUMENTS: dict[str, Any] = {
    "stream": "any-stream", "super_stream": "any-super-stream", "callback": lambda message, context: None,
    "body": b"x", "bodies": [b"x"], "name": "any-name", "role": Role.CONSUMER, "pool": None,
    "routing_key": "k", "size": 1, "amqp_uri": "amqp://h:5672", "hook": lambda event: None,
}


def public_methods(cls: type) -> list[str]:
    return sorted(name for name, _ in inspect.getmembers(cls, inspect.isfunction)
                  if not name.startswith("_") and name != "close")


async def assert_every_method_refuses(handle: Any) -> list[str]:
    """Call each public method of the closed ``handle``; each must raise HandleClosed within 1 s."""
    called = []
    for name in public_methods(type(handle)):
        signature = inspect.signature(getattr(type(handle), name))
        kwargs = {}
        for param in list(signature.parameters.values())[1:]:
            if param.default is param.empty and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                assert param.name in ARGUMENTS, f"add a value for {param.name!r} ({type(handle).__name__}.{name})"
                kwargs[param.name] = ARGUMENTS[param.name]
        started = time.monotonic()
        with pytest.raises(HandleClosed, match="closed"):
            result = getattr(handle, name)(**kwargs)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, 1.0)
        assert time.monotonic() - started < 1.0, f"{type(handle).__name__}.{name} took too long to refuse"
        called.append(f"{type(handle).__name__}.{name}")
    await handle.close()  # and close() itself stays idempotent
    return called


async def test_every_public_method_of_a_closed_handle_raises_handle_closed(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    walked: list[str] = []
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
        await env.create_super_stream(f"{rabbitmq_unique_name}-super", partitions=2)
        try:
            producer = await env.producer(rabbitmq_unique_name, name="p")
            pending = await producer.submit(b"sent before close")
            consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: None, name="c")
            super_producer = await env.super_stream_producer(f"{rabbitmq_unique_name}-super", key=lambda body: "k")
            super_consumer = await env.super_stream_consumer(f"{rabbitmq_unique_name}-super", lambda m, c: None)
            for handle in (producer, consumer, super_producer, super_consumer):
                await handle.close()
                walked += await assert_every_method_refuses(handle)
            assert (await pending).confirmed  # sent before close: it was flushed and confirmed
        finally:
            await env.delete_super_stream(f"{rabbitmq_unique_name}-super", missing_ok=True)
            await env.delete_stream(rabbitmq_unique_name, missing_ok=True)
    walked += await assert_every_method_refuses(env)
    for cls in (Producer, Consumer, SuperStreamProducer, SuperStreamConsumer, Environment):
        assert {f"{cls.__name__}.{m}" for m in public_methods(cls)} <= set(walked)
    print(f"{len(walked)} public methods refused after close")


async def test_messages_pending_when_the_stream_is_deleted_fail_with_the_reason_and_nothing_warns(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
        producer = await env.producer(rabbitmq_unique_name, name="p")
        consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: None, offset="first")
        await producer.send_wait(b"stored")
        fates: list[Confirmation] = []
        await producer.send(b"maybe", on_confirm=fates.append)  # still in the buffer: linger
        with caplog.at_level(logging.INFO, logger="smartclient"):
            await env.delete_stream(rabbitmq_unique_name)
            # a window, not a wait: a MetadataUpdate the broker sends has nothing to wait for; it would arrive now
            await asyncio.sleep(0.5)
        assert producer.closed and consumer.closed
        assert "was deleted by this Environment" in str(producer.failure)
        assert all(not f.confirmed and "deleted" in f.reason for f in fates) and len(fates) <= 1
        noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                 or "recover" in r.getMessage()]
        assert not noisy, noisy
        with pytest.raises(HandleClosed, match="was deleted by this Environment"):
            await producer.send_wait(b"after")
        assert env.placements() == []


async def test_a_stream_deleted_elsewhere_leaves_nothing_of_it_once_its_handles_are_closed(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """What closed handles and subscriptions leave (their totals, so that each stream's metric series stays
    monotonic) is kept per stream while it exists.  A stream another process deletes must take it along once this
    Environment's handles on it are closed, or a service whose streams others create and delete keeps a little
    of every stream it ever used."""
    node = rabbitmq_testbed.nodes[0]
    subscriptions, handles = "closed subscriptions' counts", "retired handle totals"
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
        before = env.streams.resources()
        producer = await env.producer(rabbitmq_unique_name, name="p")
        consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: None, offset="first")
        await producer.send_wait(b"one")
        got: list[int] = []
        reader = await env.consumer(rabbitmq_unique_name, lambda m, c: got.append(c.offset), offset="first")
        await wait_until(lambda: got, 10, "the second consumer's message")
        await reader.close()
        kept = env.streams.resources()
        assert kept[subscriptions] > before[subscriptions] and kept.get(handles, 1) > before.get(handles, 0)
        await delete_streams(rabbitmq_testbed, rabbitmq_unique_name)  # by someone else
        await wait_until(lambda: producer.failure is not None and consumer.failure is not None, 30,
                         lambda: f"both handles to stop (producer: {producer.failure}, consumer: {consumer.failure})")
        assert "does not exist" in str(consumer.failure), consumer.failure
        await producer.close()
        await consumer.close()
        after = env.streams.resources()
        assert (after[subscriptions], after.get(handles)) == (before[subscriptions], before.get(handles)), after
        assert after["streams gone, waiting for their last handle"] == 0


async def test_creating_an_existing_stream_with_other_arguments_names_the_difference(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port),
                           management=rabbitmq_testbed.management()) as env:
        await env.create_stream(rabbitmq_unique_name, {"max-age": "1h"})
        try:
            await env.create_stream(rabbitmq_unique_name, {"max-age": "1h"}, exists_ok=True)  # the same: fine
            with pytest.raises(TopologyError, match=r"already exists$"):
                await env.create_stream(rabbitmq_unique_name, {"max-age": "1h"})
            with pytest.raises(TopologyError) as info:
                await env.create_stream(rabbitmq_unique_name, {"max-age": "2h"}, exists_ok=True)
            assert f"stream {rabbitmq_unique_name!r} already exists with other arguments" in str(info.value)
            assert "x-max-age: asked '2h', it has '1h'" in str(info.value)
        finally:
            await env.delete_stream(rabbitmq_unique_name)


async def test_last_publishing_id_says_what_the_broker_stored(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    assert "stored" in (Producer.last_publishing_id.__doc__ or "")  # help() shows ours, not int's
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
        try:
            unnamed = await env.producer(rabbitmq_unique_name)
            fresh = await env.producer(rabbitmq_unique_name, name="fresh")
            assert unnamed.last_publishing_id is None and fresh.last_publishing_id == 0
            await fresh.send_batch([b"a", b"b", b"c"])
            await fresh.close()
            again = await env.producer(rabbitmq_unique_name, name="fresh")
            assert again.last_publishing_id == 3
        finally:
            await env.delete_stream(rabbitmq_unique_name)


async def test_consumers_and_producers_share_one_connection_per_node(rabbitmq_testbed: TestBed) -> None:
    """20 consumers and 5 producers on 3 streams through the round-robin LB: the connections and LB sessions
    grow with the nodes, not with the producers and consumers."""
    host, port = rabbitmq_testbed.lb("stream")
    streams = [f"share-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    for i, stream in enumerate(streams):
        await create_stream_led_by(rabbitmq_testbed, stream, i)
    try:
        before = rabbitmq_testbed.haproxy.sessions("stream_roundrobin")  # type: ignore[attr-defined]
        async with Environment(rabbitmq_testbed.stream_uri(host, port),
                               resolver=LoadBalancer(Address(host, port))) as env:
            producers = [await env.producer(streams[i % 3], name=f"p{i}") for i in range(5)]
            consumers = [await env.consumer(streams[i % 3], lambda m, c: None) for i in range(20)]
            sessions = rabbitmq_testbed.haproxy.sessions("stream_roundrobin") - before  # type: ignore[attr-defined]
            records = env.placements()
            pairs = {(r.role, r.node) for r in records}
            connections = {r.connection for r in records}
            minimum = len(pairs) + 1  # one connection per (role, node) needed, and the locator
            print(f"{len(records)} placements on {len(connections)} connections; {sessions} LB sessions; "
                  f"minimum {minimum}; opened {env.streams.connector.opened}")
            assert len(connections) == len(pairs) <= 2 * len(rabbitmq_testbed.nodes)
            assert sessions <= 1.5 * minimum, (sessions, minimum)  # the bench holds the 1.2 target
            for producer in producers:
                assert producer.node == stream_members(rabbitmq_testbed, producer.stream)[0]
            for consumer in consumers:
                assert consumer.node in stream_members(rabbitmq_testbed, consumer.stream)[1]
            await producers[0].send_wait(b"shared")  # the shared connections carry traffic
            for handle in (*producers, *consumers):
                await handle.close()
            assert env.placements() == []
    finally:
        await delete_streams(rabbitmq_testbed, *streams)
