"""Super streams against the real cluster: creation, routing (hash and key), placement, SAC groups."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest

from smartclient import Address, ConfigurationError, Environment, StreamNotFound, TopologyError, hash_partition
from smartclient.testing import TestBed
from smartclient.testing.streams import stream_members


@pytest.fixture
async def env(testbed: TestBed) -> AsyncIterator[Environment]:
    node = testbed.nodes[0]
    async with Environment(testbed.stream_uri(node.host, node.stream_port)) as environment:
        yield environment


async def _drain(env: Environment, streams: list[str], expect: int, timeout: float = 10.0) -> dict[str, list[bytes]]:
    got: dict[str, list[bytes]] = defaultdict(list)
    consumers = []
    for stream in streams:
        consumers.append(await env.consumer(stream, lambda m, c, s=stream: got[s].append(bytes(m)), offset="first"))
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in got.values()) < expect and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    for consumer in consumers:
        await consumer.close()
    return got


async def test_create_partitions_route_and_delete(env: Environment, unique_name: str) -> None:
    names = await env.create_super_stream(unique_name, partitions=3)
    try:
        assert names == [f"{unique_name}-0", f"{unique_name}-1", f"{unique_name}-2"]
        assert await env.partitions(unique_name) == names
        assert await env.route(unique_name, "1") == [f"{unique_name}-1"]
        assert await env.route(unique_name, "nowhere") == []
        with pytest.raises(TopologyError, match="already exists"):
            await env.create_super_stream(unique_name, partitions=3)
        await env.create_super_stream(unique_name, partitions=3, exists_ok=True)
    finally:
        await env.delete_super_stream(unique_name)
    with pytest.raises(StreamNotFound):
        await env.partitions(unique_name)
    with pytest.raises(ConfigurationError, match="either partitions=N or binding_keys"):
        await env.create_super_stream(unique_name, partitions=2, binding_keys=["a"])
    with pytest.raises(ConfigurationError, match="positive int"):
        await env.create_super_stream(unique_name, partitions=0)


async def test_hash_routing_agrees_with_the_reference_vectors(
    env: Environment, testbed: TestBed, unique_name: str
) -> None:
    partitions = await env.create_super_stream(unique_name, partitions=3)
    try:
        producer = await env.super_stream_producer(unique_name, key=lambda body: body.decode().split(":")[0])
        # each partition producer sits on its partition's leader
        for partition, p in producer.producers.items():
            assert p.node == stream_members(testbed, partition)[0]
        keys = [f"hello{i}" for i in range(1, 11)]
        for key in keys:
            assert await producer.send_wait(f"{key}:payload".encode()) == [hash_partition(key, partitions)]
        got = await _drain(env, partitions, expect=10)
        # the Java and Go clients' own test vectors, indexes into [-0, -1, -2]
        expected = {"hello1": 1, "hello2": 0, "hello3": 1, "hello4": 2, "hello5": 0, "hello6": 2,
                    "hello7": 0, "hello8": 1, "hello9": 0, "hello10": 2}
        for key, index in expected.items():
            assert f"{key}:payload".encode() in got[partitions[index]], key
        assert sum(len(v) for v in got.values()) == 10
        await producer.close()
    finally:
        await env.delete_super_stream(unique_name)


async def test_key_routing_agrees_with_the_broker_bindings(env: Environment, unique_name: str) -> None:
    partitions = await env.create_super_stream(unique_name, binding_keys=["eu", "us", "apac"])
    try:
        producer = await env.super_stream_producer(unique_name, routing="key")
        for region in ("eu", "us", "apac", "us"):
            assert await producer.send_wait(f"order from {region}".encode(), key=region) == [
                f"{unique_name}-{region}"]
        with pytest.raises(TopologyError, match=r"no partition .* bound to routing key 'mars'"):
            await producer.send_wait(b"x", key="mars")
        got = await _drain(env, partitions, expect=4)
        assert got[f"{unique_name}-us"] == [b"order from us", b"order from us"]
        assert got[f"{unique_name}-apac"] == [b"order from apac"]
        await producer.close()
    finally:
        await env.delete_super_stream(unique_name)


async def test_super_stream_consumer_group_has_one_active_per_partition(
    env: Environment, unique_name: str
) -> None:
    partitions = await env.create_super_stream(unique_name, partitions=3)
    try:
        received: dict[str, list[bytes]] = {"a": [], "b": []}
        a = await env.super_stream_consumer(unique_name, lambda m, c: received["a"].append(bytes(m)),
                                            offset="first", name="group", single_active=True)
        b = await env.super_stream_consumer(unique_name, lambda m, c: received["b"].append(bytes(m)),
                                            offset="first", name="group", single_active=True)
        deadline = time.monotonic() + 10
        while len(a.active_partitions) + len(b.active_partitions) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sorted(a.active_partitions + b.active_partitions) == partitions  # exactly one each
        producer = await env.super_stream_producer(unique_name, key=lambda body: body.decode())
        for i in range(30):
            await producer.send_wait(f"key-{i}".encode())
        deadline = time.monotonic() + 10
        while len(received["a"]) + len(received["b"]) < 30 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sorted(received["a"] + received["b"]) == sorted(f"key-{i}".encode() for i in range(30))
        await a.close()  # its partitions fail over to b
        deadline = time.monotonic() + 10
        while len(b.active_partitions) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sorted(b.active_partitions) == partitions
        await b.close()
        await producer.close()
    finally:
        await env.delete_super_stream(unique_name)


async def test_super_stream_over_the_management_api(env: Environment, testbed: TestBed, unique_name: str) -> None:
    with testbed.management() as api:
        names = await env.create_super_stream(unique_name, partitions=2, management=api,
                                              arguments={"max-age": "1D"})
        with pytest.raises(TopologyError, match="already exists"):
            await env.create_super_stream(unique_name, partitions=2, management=api)
    try:
        assert await env.partitions(unique_name) == names
        assert await env.route(unique_name, "1") == [names[1]]
        with testbed.management() as api:
            assert api.queue("/", names[0])["arguments"]["x-max-age"] == "1D"
        producer = await env.super_stream_producer(unique_name, key=lambda body: "k")
        assert (await producer.send_wait(b"x"))[0] in names
        assert all(isinstance(p.node, Address) for p in producer.producers.values())
        await producer.close()
    finally:
        await env.delete_super_stream(unique_name)
