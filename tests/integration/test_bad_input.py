"""The bad-input catalogue: every case gets a typed error whose message names the problem; a message
published just before it is still there exactly once, and the same Environment still works after it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from resolvers import AllowList, DnsResolver, LoadBalancer
from smartclient import (
    Address,
    AddressNotAllowed,
    AuthenticationFailed,
    BatchingPolicy,
    ConfigurationError,
    ConnectionFailed,
    ConsumerFlow,
    Environment,
    MessageTooLarge,
    NodeUnreachable,
    OffsetTracking,
    PublishingIdNotIncreasing,
    ResolutionError,
    ResolutionTimeout,
    SmartClientError,
    StreamArguments,
    StreamFilter,
    StreamNotFound,
    TopologyError,
)
from smartclient.core.settings import ConnectionOptions, Credentials, Telemetry
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, raw_stream_client

from .conftest import direct_env, read_to_end


@dataclass
class Ctx:
    bed: TestBed
    env: Environment
    ok: str  # a stream that exists
    missing: str  # a stream that does not


Case = Callable[[Ctx], Awaitable[Any]]
CASES: list[tuple[str, type[SmartClientError], str, Case]] = []


def case(name: str, error: type[SmartClientError], message: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES.append((name, error, message, fn))
        return fn

    return register


# -- URIs and credentials ----------------------------------------------------------------------------
@case("malformed URI", ConfigurationError, "malformed stream URI")
async def _(ctx: Ctx) -> None:
    Environment("rabbitmq-stream://host:notaport/")


@case("unsupported scheme", ConfigurationError, "unsupported URI scheme 'amqps'")
async def _(ctx: Ctx) -> None:
    Environment("amqps://lb:5671/")


@case("user without password", ConfigurationError, "names user 'app' without a password")
async def _(ctx: Ctx) -> None:
    Environment("rabbitmq-stream://app@lb:5552/")


@case("URI path with more than a vhost", ConfigurationError, "more than a vhost")
async def _(ctx: Ctx) -> None:
    Environment("rabbitmq-stream://lb:5552/a/b")


@case("unknown vhost", AuthenticationFailed, "vhost")
async def _(ctx: Ctx) -> None:
    async with direct_env(ctx.bed, vhost=f"no-such-vhost-{uuid.uuid4().hex[:4]}"):
        pass


@case("wrong credentials", AuthenticationFailed, "refused the credentials")
async def _(ctx: Ctx) -> None:
    async with direct_env(ctx.bed, credentials=Credentials("guest", "not-the-password")):
        pass


@case("no entry point reachable", ConnectionFailed, "no entry point could be reached")
async def _(ctx: Ctx) -> None:
    async with Environment("rabbitmq-stream://guest:guest@127.0.0.1:1/"):
        pass


@case("negative heartbeat", ConfigurationError, r"heartbeat must be an int from 0 to 3600 \(seconds; 0: off\), not -1")
async def _(ctx: Ctx) -> None:
    direct_env(ctx.bed, connection=ConnectionOptions(heartbeat=-1))


@case("frame max too small", ConfigurationError, "frame_max must be an int from 8192")
async def _(ctx: Ctx) -> None:
    direct_env(ctx.bed, connection=ConnectionOptions(frame_max=100))


@case("meter provider without get_meter", ConfigurationError, r"meter_provider must be an OpenTelemetry MeterProvider")
async def _(ctx: Ctx) -> None:
    direct_env(ctx.bed, telemetry=Telemetry(meter_provider=object()))


@case("tracer provider without get_tracer", ConfigurationError, r"tracer_provider must be an OpenTelemetry TracerProv")
async def _(ctx: Ctx) -> None:
    direct_env(ctx.bed, telemetry=Telemetry(tracer_provider=object()))


@case("credit_after given as a str", ConfigurationError, r"ConsumerFlow.credit_after must be .*'half' \(a str\)")
async def _(ctx: Ctx) -> None:
    ConsumerFlow(credit_after="half")  # type: ignore[arg-type]


@case("confirm_timeout given as a str", ConfigurationError, r"BatchingPolicy.confirm_timeout .*, not '60' \(a str\)")
async def _(ctx: Ctx) -> None:
    BatchingPolicy(confirm_timeout="60")  # type: ignore[arg-type]


@case("flow given as a dict", ConfigurationError, r"flow must be a ConsumerFlow .*: pass ConsumerFlow\(initial_")
async def _(ctx: Ctx) -> None:
    before = ctx.env.placements()
    try:
        await ctx.env.consumer(ctx.ok, on_chunk=lambda chunk: None, flow={"initial_credit": 5})  # type: ignore[arg-type]
    finally:
        assert ctx.env.placements() == before  # refused before any placement


# -- streams and their arguments ------------------------------------------------------------------------
@case("consumer without a callback", ConfigurationError, "takes a callback or on_chunk, and only one of them")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, None)


@case("consumer with a callback and on_chunk", ConfigurationError, "takes a callback or on_chunk, and only one")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, lambda message, context: None, on_chunk=lambda chunk: None)


@case("consumer with an on_chunk that cannot be called", ConfigurationError,
      "on_chunk of a consumer .* must be callable")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, on_chunk="print")  # type: ignore[arg-type]


@case("existing stream, other arguments", TopologyError, r"already exists with other arguments")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_stream(ctx.ok, {"max-age": "1h"}, exists_ok=True)


@case("unknown stream: topology", StreamNotFound, "does not exist")
async def _(ctx: Ctx) -> None:
    await ctx.env.topology(ctx.missing)


@case("unknown stream: producer", StreamNotFound, "does not exist")
async def _(ctx: Ctx) -> None:
    await ctx.env.producer(ctx.missing)


@case("unknown stream: consumer", StreamNotFound, "does not exist")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.missing, lambda m, c: None)


@case("unknown super stream", StreamNotFound, "does not exist")
async def _(ctx: Ctx) -> None:
    await ctx.env.streams.partitions(ctx.missing)


@case("empty stream name", ConfigurationError, "stream must be a non-empty str")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_stream("")


@case("max_age without a unit", ConfigurationError, "one of Y M D h m s")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_stream(ctx.missing, {"max-age": "7"})


@case("filter size over 255", ConfigurationError, "filter_size_bytes must be an int from 16 to 255")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_stream(ctx.missing, StreamArguments(filter_size_bytes=300))


@case("segment size over 3 GB", ConfigurationError, "max_segment_size_bytes must be an int from 1 to")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_stream(ctx.missing, StreamArguments(max_segment_size_bytes=4_000_000_000))


@case("unknown argument key", ConfigurationError, "unknown stream argument 'x-queue-mode'")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_stream(ctx.missing, {"x-queue-mode": "lazy"})


@case("initial cluster size 0", ConfigurationError, "initial_cluster_size must be a positive int")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_stream(ctx.missing, StreamArguments(initial_cluster_size=0))


@case("super stream with both partitions and keys", ConfigurationError, "either partitions=N or binding_keys")
async def _(ctx: Ctx) -> None:
    await ctx.env.create_super_stream(ctx.missing, partitions=2, binding_keys=["a", "b"])


# -- offsets and consumers --------------------------------------------------------------------------------
@case("offset word not known", ConfigurationError, "one of Y M D h m s")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, lambda m, c: None, offset="beginning")


@case("negative offset", ConfigurationError, "non-negative")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, lambda m, c: None, offset=-5)


@case("offset of a wrong type", ConfigurationError, "must be 'first', 'last', 'next'")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, lambda m, c: None, offset=dt.date(2026, 1, 1))


@case("offset tracking without a name", ConfigurationError, "needs a name")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, lambda m, c: None, tracking=OffsetTracking())


@case("filter given as a str", ConfigurationError, r"StreamFilter.values must be .*, not 'eu' \(a str\)")
async def _(ctx: Ctx) -> None:
    await ctx.env.consumer(ctx.ok, lambda m, c: None, filter=StreamFilter("eu"))


# -- publishing --------------------------------------------------------------------------------------------
@case("non-increasing publishing id", PublishingIdNotIncreasing, "not greater than")
async def _(ctx: Ctx) -> None:
    producer = await ctx.env.producer(ctx.ok, name=f"dedup-{uuid.uuid4().hex[:6]}")
    try:
        await producer.send_wait(b"five", publishing_id=5)
        await producer.send_wait(b"three", publishing_id=3)
    finally:
        await producer.close()


@case("publishing id on an unnamed producer", ConfigurationError, "deduplication needs a producer name")
async def _(ctx: Ctx) -> None:
    producer = await ctx.env.producer(ctx.ok)
    try:
        await producer.send_wait(b"x", publishing_id=1)
    finally:
        await producer.close()


@case("message over the frame max", MessageTooLarge, "does not fit the negotiated frame max")
async def _(ctx: Ctx) -> None:
    producer = await ctx.env.producer(ctx.ok)
    try:
        await producer.send(b"x" * (2 * 1024 * 1024))
    finally:
        await producer.close()


@case("empty batch", ConfigurationError, "empty batch")
async def _(ctx: Ctx) -> None:
    producer = await ctx.env.producer(ctx.ok)
    try:
        await producer.send_batch([])
    finally:
        await producer.close()


# -- resolution and the network ------------------------------------------------------------------------------
@case("DNS NXDOMAIN", ResolutionError, r"nowhere\.smartclient\.test does not exist")
async def _(ctx: Ctx) -> None:
    host, port = ctx.bed.dns_address
    await DnsResolver([host], port=port).resolve(Address("nowhere.smartclient.test", 5552))


@case("DNS timeout", ResolutionTimeout, r"no answer for silent-\w+\.smartclient\.test")
async def _(ctx: Ctx) -> None:
    name = f"silent-{uuid.uuid4().hex[:6]}.smartclient.test"
    ctx.bed.add_dns_record(name, "DROP", "-")
    host, port = ctx.bed.dns_address
    await DnsResolver([host], port=port, timeout=0.5).resolve(Address(name, 5552))


@case("resolver that raises", ResolutionError, r"resolver broken failed on [\w.]+:\d+: KeyError")
async def _(ctx: Ctx) -> None:
    def broken(address: Address) -> Address:
        raise KeyError(address.host)

    async with direct_env(ctx.bed, resolver=broken) as env:
        await env.producer(ctx.ok)


@case("resolver that returns garbage", ResolutionError, "a resolver must return an Address")
async def _(ctx: Ctx) -> None:
    async with direct_env(ctx.bed, resolver=lambda address: 12345) as env:
        await env.producer(ctx.ok)


@case("address outside the allow-list", AddressNotAllowed, "outside the allow-list")
async def _(ctx: Ctx) -> None:
    async with direct_env(ctx.bed, allow=AllowList(["127.0.0.1", "10.0.0.0/8"])) as env:
        await env.producer(ctx.ok)


@case("LB that never reaches the needed node", NodeUnreachable, "reached only")
async def _(ctx: Ctx) -> None:
    host, port = ctx.bed.lb("stream", "source")
    async with raw_stream_client(ctx.bed, host, port) as probe:
        props = probe.server_properties
        sticky = ctx.bed.node_by_advertised(props["advertised_host"], int(props["advertised_port"]))
    other = f"{ctx.missing}-other"
    await create_stream_led_by(ctx.bed, other, (ctx.bed.nodes.index(sticky) + 1) % 3)
    try:
        async with Environment(ctx.bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port))) as env:
            await env.producer(other)
    finally:
        await delete_streams(ctx.bed, other)


@case("TLS without verification material", ConnectionFailed, "certificate verify failed")
async def _(ctx: Ctx) -> None:
    node = ctx.bed.nodes[0]
    uri = ctx.bed.stream_uri(node.host, node.stream_tls_port).replace("rabbitmq-stream://", "rabbitmq-stream+tls://")
    async with Environment(uri, tls=ssl.create_default_context()):  # the system CAs do not know the test CA
        pass


# -- the runner ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ok_stream(rabbitmq_testbed: TestBed) -> Iterator[str]:
    name = f"bad-input-ok-{uuid.uuid4().hex[:6]}"
    asyncio.run(create_stream_led_by(rabbitmq_testbed, name, 0))
    yield name
    asyncio.run(delete_streams(rabbitmq_testbed, name))


def test_the_catalogue_has_at_least_30_cases() -> None:
    assert len(CASES) >= 30
    assert len({name for name, *_ in CASES}) == len(CASES)


@pytest.mark.parametrize("name, error, message, run", CASES, ids=[c[0] for c in CASES])
async def test_bad_input(rabbitmq_testbed: TestBed, ok_stream: str, name: str, error: type[SmartClientError],
                         message: str, run: Case) -> None:
    async with direct_env(rabbitmq_testbed) as env:
        tag = uuid.uuid4().hex[:8]
        before, after = json.dumps({"case": name, "at": "before", "tag": tag}).encode(), json.dumps(
            {"case": name, "at": "after", "tag": tag}).encode()
        producer = await env.producer(ok_stream)
        await producer.send_wait(before)
        ctx = Ctx(rabbitmq_testbed, env, ok_stream, f"missing-{tag}")
        with pytest.raises(error, match=message) as info:
            await run(ctx)
        assert "guest:guest" not in str(info.value) and "not-the-password" not in str(info.value)
        # the Environment still works, and nothing was lost
        await producer.send_wait(after)
        got = await read_to_end(env, ok_stream, timeout=10.0)
        assert got.count(before) == 1 and got.count(after) == 1
        await producer.close()
