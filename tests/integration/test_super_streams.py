"""Super streams against the real cluster: creation, routing (hash and key), placement, SAC groups."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import defaultdict

import pytest

from smartclient import (
    Address,
    ConfigurationError,
    Confirmation,
    Environment,
    HandleClosed,
    StreamNotFound,
    TopologyError,
    hash_partition,
)
from smartclient.stream.super_stream import SuperStreamProducer
from smartclient.testing import TestBed
from smartclient.testing.streams import stream_members

from ..conftest import wait_until


async def _drain(env: Environment, streams: list[str], expect: int, timeout: float = 10.0) -> dict[str, list[bytes]]:
    got: dict[str, list[bytes]] = defaultdict(list)
    consumers = []
    for stream in streams:
        consumers.append(await env.consumer(stream, lambda m, c, s=stream: got[s].append(bytes(m)), offset="first"))
    await wait_until(lambda: sum(len(v) for v in got.values()) >= expect, timeout, f"{expect} messages")
    for consumer in consumers:
        await consumer.close()
    return got


async def test_create_partitions_route_and_delete(env: Environment, rabbitmq_unique_name: str) -> None:
    names = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        assert names == [f"{rabbitmq_unique_name}-0", f"{rabbitmq_unique_name}-1", f"{rabbitmq_unique_name}-2"]
        assert await env.streams.partitions(rabbitmq_unique_name) == names
        assert await env.streams.route(rabbitmq_unique_name, "1") == [f"{rabbitmq_unique_name}-1"]
        assert await env.streams.route(rabbitmq_unique_name, "nowhere") == []
        with pytest.raises(TopologyError, match="already exists"):
            await env.create_super_stream(rabbitmq_unique_name, partitions=3)
        await env.create_super_stream(rabbitmq_unique_name, partitions=3, exists_ok=True)
    finally:
        await env.delete_super_stream(rabbitmq_unique_name)
    with pytest.raises(StreamNotFound):
        await env.streams.partitions(rabbitmq_unique_name)
    with pytest.raises(ConfigurationError, match="either partitions=N or binding_keys"):
        await env.create_super_stream(rabbitmq_unique_name, partitions=2, binding_keys=["a"])
    with pytest.raises(ConfigurationError, match="positive int"):
        await env.create_super_stream(rabbitmq_unique_name, partitions=0)


async def test_hash_routing_agrees_with_the_reference_vectors(
    env: Environment, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        producer = await env.super_stream_producer(rabbitmq_unique_name, key=lambda body: body.decode().split(":")[0])
        # each partition producer sits on its partition's leader
        for partition, p in producer.producers.items():
            assert p.node == stream_members(rabbitmq_testbed, partition)[0]
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
        await env.delete_super_stream(rabbitmq_unique_name)


async def test_key_routing_agrees_with_the_broker_bindings(env: Environment, rabbitmq_unique_name: str) -> None:
    partitions = await env.create_super_stream(rabbitmq_unique_name, binding_keys=["eu", "us", "apac"])
    try:
        producer = await env.super_stream_producer(rabbitmq_unique_name, routing="key")
        for region in ("eu", "us", "apac", "us"):
            assert await producer.send_wait(f"order from {region}".encode(), key=region) == [
                f"{rabbitmq_unique_name}-{region}"]
        with pytest.raises(TopologyError, match=r"no partition .* bound to routing key 'mars'"):
            await producer.send_wait(b"x", key="mars")
        got = await _drain(env, partitions, expect=4)
        assert got[f"{rabbitmq_unique_name}-us"] == [b"order from us", b"order from us"]
        assert got[f"{rabbitmq_unique_name}-apac"] == [b"order from apac"]
        await producer.close()
    finally:
        await env.delete_super_stream(rabbitmq_unique_name)


async def test_super_stream_consumer_group_has_one_active_per_partition(
    env: Environment, rabbitmq_unique_name: str
) -> None:
    partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        received: dict[str, list[bytes]] = {"a": [], "b": []}
        a = await env.super_stream_consumer(rabbitmq_unique_name, lambda m, c: received["a"].append(bytes(m)),
                                            offset="first", name="group", single_active=True)
        b = await env.super_stream_consumer(rabbitmq_unique_name, lambda m, c: received["b"].append(bytes(m)),
                                            offset="first", name="group", single_active=True)
        await wait_until(lambda: len(a.active_partitions) + len(b.active_partitions) >= 3, 10,
                         "an active consumer on each partition")
        assert sorted(a.active_partitions + b.active_partitions) == partitions  # exactly one each
        producer = await env.super_stream_producer(rabbitmq_unique_name, key=lambda body: body.decode())
        for i in range(30):
            await producer.send_wait(f"key-{i}".encode())
        await wait_until(lambda: len(received["a"]) + len(received["b"]) >= 30, 10, "30 messages")
        assert sorted(received["a"] + received["b"]) == sorted(f"key-{i}".encode() for i in range(30))
        await a.close()  # its partitions fail over to b
        await wait_until(lambda: len(b.active_partitions) >= 3, 10, "every partition to fail over to b")
        assert sorted(b.active_partitions) == partitions
        await b.close()
        await producer.close()
    finally:
        await env.delete_super_stream(rabbitmq_unique_name)


async def test_super_stream_over_the_management_api(
    env: Environment, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    with rabbitmq_testbed.management() as api:
        names = await env.create_super_stream(rabbitmq_unique_name, partitions=2, management=api,
                                              arguments={"max-age": "1D"})
        with pytest.raises(TopologyError, match="already exists"):
            await env.create_super_stream(rabbitmq_unique_name, partitions=2, management=api)
    try:
        assert await env.streams.partitions(rabbitmq_unique_name) == names
        assert await env.streams.route(rabbitmq_unique_name, "1") == [names[1]]
        with rabbitmq_testbed.management() as api:
            assert api.queue("/", names[0])["arguments"]["x-max-age"] == "1D"
        producer = await env.super_stream_producer(rabbitmq_unique_name, key=lambda body: "k")
        assert (await producer.send_wait(b"x"))[0] in names
        assert all(isinstance(p.node, Address) for p in producer.producers.values())
        await producer.close()
    finally:
        await env.delete_super_stream(rabbitmq_unique_name)


async def test_the_publishing_surface_of_producer_confirms_every_message(
    env: Environment, rabbitmq_unique_name: str
) -> None:
    """submit, send with on_confirm, send_many, send_batch and flush, each routed by key, as on Producer."""
    partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        producer = await env.super_stream_producer(rabbitmq_unique_name, key=lambda body: body.decode().split(":")[0],
                                                   name="surface")
        fates: list[Confirmation] = []
        sent: list[bytes] = []
        for i in range(30):  # send + on_confirm, then flush: every callback has its answer
            sent.append(f"k{i}:send".encode())
            assert await producer.send(sent[-1], on_confirm=fates.append) == [
                hash_partition(f"k{i}", partitions)]
        await producer.flush()
        assert len(fates) == 30 and all(f.confirmed for f in fates)
        futures = []
        for i in range(30):  # submit: a future of each Confirmation
            sent.append(f"k{i}:submit".encode())
            futures.append(await producer.submit(sent[-1]))
        await producer.flush()
        assert all(f.done() and f.result().confirmed for f in futures)
        batch = [f"k{i}:batch".encode() for i in range(30)]  # send_batch: one Confirmation per message, in order
        sent += batch
        confirmations = await producer.send_batch(batch)
        assert len(confirmations) == 30 and all(c.confirmed for c in confirmations)
        per_partition: dict[str, list[int]] = defaultdict(list)
        for body, confirmation in zip(batch, confirmations, strict=True):
            per_partition[hash_partition(body.decode().split(":")[0], partitions)].append(confirmation.publishing_id)
        assert all(ids == sorted(set(ids)) for ids in per_partition.values())  # each partition numbers in order
        many = [f"k{i}:many".encode() for i in range(30)]  # send_many with ids: message i carries 1000 + i
        sent += many
        await producer.send_many(many, first_publishing_id=1000)
        await producer.send_many([b"k1:same-key", b"k2:same-key"], key="fixed")  # key= routes them all
        sent += [b"k1:same-key", b"k2:same-key"]
        await producer.flush()
        assert await producer.send_wait(b"k7:last") == [hash_partition("k7", partitions)]
        sent.append(b"k7:last")
        got = await _drain(env, partitions, expect=len(sent))
        assert sorted(b for bodies in got.values() for b in bodies) == sorted(sent)  # each stored once
        for partition, bodies in got.items():
            for body in bodies:
                key = "fixed" if body.endswith(b":same-key") else body.decode().split(":")[0]
                assert hash_partition(key, partitions) == partition, body
        await producer.close()
    finally:
        await env.delete_super_stream(rabbitmq_unique_name)


async def test_a_closed_super_stream_producer_or_consumer_refuses_every_call(
    env: Environment, rabbitmq_unique_name: str
) -> None:
    await env.create_super_stream(rabbitmq_unique_name, partitions=2)
    try:
        producer = await env.super_stream_producer(rabbitmq_unique_name, key=lambda body: "k")
        pending = await producer.submit(b"before close")
        consumer = await env.super_stream_consumer(rabbitmq_unique_name, lambda m, c: None)
        await producer.close()
        assert (await pending).confirmed  # what was sent before close() was confirmed, not dropped
        await consumer.close()
        arguments = {"body": b"x", "bodies": [b"x"]}
        for handle in (producer, consumer):
            for name, method in inspect.getmembers(type(handle), inspect.isfunction):
                if name.startswith("_") or name == "close":
                    continue
                required = [p.name for p in list(inspect.signature(method).parameters.values())[1:]
                            if p.default is p.empty]
                started = time.monotonic()
                with pytest.raises(HandleClosed, match="is closed"):
                    result = getattr(handle, name)(**{p: arguments[p] for p in required})
                    if inspect.isawaitable(result):
                        await asyncio.wait_for(result, 1.0)
                assert time.monotonic() - started < 1.0, name
            await handle.close()  # idempotent
        assert {"route", "send", "send_many", "submit", "send_wait", "send_batch", "flush"} <= {
            name for name, _ in inspect.getmembers(SuperStreamProducer, inspect.isfunction)}
    finally:
        await env.delete_super_stream(rabbitmq_unique_name)
