"""The streams guide (seed 001) through smartclient: declaration, offsets, deduplication."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smartclient import (
    ConfigurationError,
    Environment,
    OffsetSpec,
    PublishingIdNotIncreasing,
    StreamArguments,
    StreamNotFound,
    TopologyError,
)
from smartclient.testing import TestBed
from smartclient.testing.streams import delete_streams


@pytest.fixture
async def env(testbed: TestBed) -> AsyncIterator[Environment]:
    node = testbed.nodes[0]
    async with Environment(testbed.stream_uri(node.host, node.stream_port)) as environment:
        yield environment


async def read_all(env: Environment, stream: str, offset: Any = "first", expect: int = 1,
                   timeout: float = 10.0) -> list[tuple[int, bytes]]:
    """(offset, body) of every message delivered from ``offset`` until ``expect`` arrived (or timeout)."""
    got: list[tuple[int, bytes]] = []

    async def on_message(message: bytes, context: Any) -> None:
        got.append((context.offset, bytes(message)))

    consumer = await env.consumer(stream, on_message, offset=offset)
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # anything extra would show up now
    await consumer.close()
    return got


# -- declaration ------------------------------------------------------------------------------------
async def test_declaration_arguments_reach_the_broker(env: Environment, testbed: TestBed, unique_name: str) -> None:
    args = StreamArguments(max_length_bytes=2_000_000_000, max_age="7D", max_segment_size_bytes=100_000_000,
                           filter_size_bytes=32, initial_cluster_size=2, leader_locator="client-local")
    await env.create_stream(unique_name, args)
    try:
        with testbed.management() as api:
            info = api.queue("/", unique_name)
        assert info["type"] == "stream" and len(info["members"]) == 2
        assert info["arguments"]["x-max-age"] == "7D"
        assert int(info["arguments"]["x-max-length-bytes"]) == 2_000_000_000
        assert int(info["arguments"]["x-stream-max-segment-size-bytes"]) == 100_000_000
        assert int(info["arguments"]["x-stream-filter-size-bytes"]) == 32
        await env.create_stream(unique_name, args, exists_ok=True)
        with pytest.raises(TopologyError, match="already exists"):
            await env.create_stream(unique_name, args)
    finally:
        await env.delete_stream(unique_name)
    with pytest.raises(StreamNotFound):
        await env.topology(unique_name)
    await env.delete_stream(unique_name, missing_ok=True)
    with pytest.raises(StreamNotFound):
        await env.delete_stream(unique_name)


@pytest.mark.parametrize("arguments", [
    {"x-queue-mode": "lazy"}, {"max-age": "7 days"}, {"stream-filter-size-bytes": 300},
    {"initial-cluster-size": 0}, {"queue-leader-locator": "random"},
])
async def test_bad_declarations_never_reach_the_broker(
    env: Environment, testbed: TestBed, unique_name: str, arguments: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError):
        await env.create_stream(unique_name, arguments)
    with pytest.raises(StreamNotFound):
        await env.topology(unique_name)
    await env.create_stream(f"{unique_name}-after")  # the Environment still works
    await env.delete_stream(f"{unique_name}-after")


# -- offsets ------------------------------------------------------------------------------------------
async def test_every_offset_spec_lands_on_the_right_first_message(env: Environment, unique_name: str) -> None:
    await env.create_stream(unique_name)
    try:
        producer = await env.producer(unique_name)
        for i in range(5):
            await producer.send_wait(b"a%d" % i)
        await asyncio.sleep(1.2)
        middle = dt.datetime.now(dt.timezone.utc)
        await asyncio.sleep(0.2)
        for i in range(5):
            await producer.send_wait(b"b%d" % i)
        await asyncio.sleep(2.5)
        for i in range(5):
            await producer.send_wait(b"c%d" % i)

        first = await read_all(env, unique_name, "first", expect=15)
        assert [body for _, body in first][:1] == [b"a0"] and len(first) == 15
        offsets = {body: offset for offset, body in first}
        assert (await read_all(env, unique_name, OffsetSpec.at(offsets[b"b2"]), expect=8))[0][1] == b"b2"
        assert (await read_all(env, unique_name, middle, expect=10))[0][1] == b"b0"
        assert (await read_all(env, unique_name, "2s", expect=5))[0][1] == b"c0"  # now - 2 s: after batch b
        assert (await read_all(env, unique_name, "1h", expect=15))[0][1] == b"a0"
        last = await read_all(env, unique_name, "last", expect=1)
        assert last and last[-1][1] == b"c4" and b"a0" not in [b for _, b in last]  # the last chunk only

        got: list[bytes] = []

        async def on_next(message: bytes, context: Any) -> None:
            got.append(bytes(message))

        nxt = await env.consumer(unique_name, on_next, offset="next")
        await producer.send_wait(b"d0")
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert got == [b"d0"]  # only what was published after it subscribed
        await nxt.close()
        with pytest.raises(ConfigurationError):
            await env.consumer(unique_name, on_next, offset="yesterday")
    finally:
        await env.delete_stream(unique_name)


# -- deduplication: the two worked examples of the streams guide ---------------------------------------
async def test_dedup_publish_and_restart(testbed: TestBed, unique_name: str) -> None:
    node = testbed.nodes[0]
    uri = testbed.stream_uri(node.host, node.stream_port)
    async with Environment(uri) as env:
        await env.create_stream(unique_name)
    try:
        # the application declares a named producer and publishes messages 1, 2, 3, confirmed
        async with Environment(uri) as env:
            producer = await env.producer(unique_name, name="online-shop-order")
            assert producer.last_publishing_id == 0
            for i in (1, 2, 3):
                await producer.send_wait(b"message %d" % i, publishing_id=i)
            # it publishes message 4; the broker stores it, and the application crashes before it sees
            # the confirm (here: it never looks at it, and the Environment goes away)
            await producer.send_wait(b"message 4", publishing_id=4)
        # the application restarts, declares the producer with the same name, asks for the last id
        async with Environment(uri) as env:
            producer = await env.producer(unique_name, name="online-shop-order")
            assert producer.last_publishing_id == 4
            # it "scrolls" to message 4 and publishes it again: the broker filters it out and confirms
            await producer.send_wait(b"message 4", publishing_id=4)
            # then message 5, and so on
            await producer.send_wait(b"message 5", publishing_id=5)
            stored = [body for _, body in await read_all(env, unique_name, "first", expect=5)]
        assert stored == [b"message %d" % i for i in (1, 2, 3, 4, 5)]  # message 4 once
    finally:
        await delete_streams(testbed, unique_name)


async def test_dedup_misuse_is_refused_client_side(testbed: TestBed, unique_name: str) -> None:
    from rstream import Producer as RawProducer
    from rstream import RawMessage

    node = testbed.nodes[0]
    uri = testbed.stream_uri(node.host, node.stream_port)
    try:
        async with Environment(uri) as env:
            await env.create_stream(unique_name)
            producer = await env.producer(unique_name, name="misuse")
            for i in (1, 2, 3, 10):
                await producer.send_wait(b"message %d" % i, publishing_id=i)
            # the guide's misuse: message 4 after message 10. smartclient refuses it before sending ...
            with pytest.raises(PublishingIdNotIncreasing, match="4 .* not greater than 10"):
                await producer.send_wait(b"message 4", publishing_id=4)
            await producer.send_wait(b"message 11", publishing_id=11)  # ... and the producer goes on
        # ... whereas raw rstream sends it, the broker confirms it, and it is silently dropped
        raw = RawProducer(node.host, node.stream_port, username=testbed.username, password=testbed.password)
        async with raw:
            await raw.send_wait(unique_name, RawMessage(b"message 4 (rstream)", publishing_id=4),
                                publisher_name="misuse")
        async with Environment(uri) as env:
            stored = [body for _, body in await read_all(env, unique_name, "first", expect=5)]
        assert stored == [b"message 1", b"message 2", b"message 3", b"message 10", b"message 11"]
    finally:
        await delete_streams(testbed, unique_name)


async def test_named_producer_assigns_ids_and_unnamed_refuses_them(env: Environment, unique_name: str) -> None:
    await env.create_stream(unique_name)
    try:
        named = await env.producer(unique_name, name="auto")
        await named.send_wait(b"x")
        await named.send_wait(b"y")
        assert named._highest_sent == 2
        with pytest.raises(PublishingIdNotIncreasing):
            await named.send_wait(b"z", publishing_id=2)
        unnamed = await env.producer(unique_name)
        with pytest.raises(ConfigurationError, match="deduplication needs a producer name"):
            await unnamed.send_wait(b"z", publishing_id=7)
    finally:
        await env.delete_stream(unique_name)
