"""OpenTelemetry traces against the test bed, read with the SDK's in-memory span exporter (issue 19)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import ClientSettings, Environment
from smartclient.core.settings import Telemetry
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

from ..conftest import wait_until

trace_sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK (smartclient[dev]) is needed")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")


def tracing() -> tuple[Any, Any]:
    exporter = in_memory.InMemorySpanExporter()
    provider = trace_sdk.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    return provider, exporter


def named(exporter: Any, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.fixture
async def traced(rabbitmq_testbed: TestBed, rabbitmq_unique_name: str) -> AsyncIterator[tuple[Any, Any, str]]:
    """A tracer provider with an in-memory exporter, and a stream led by the second node (deleted after)."""
    provider, exporter = tracing()
    await create_stream_led_by(rabbitmq_testbed, rabbitmq_unique_name, 1)
    try:
        yield provider, exporter, rabbitmq_unique_name
    finally:
        await delete_streams(rabbitmq_testbed, rabbitmq_unique_name)
        provider.shutdown()


async def test_a_placement_through_the_lb_is_a_span_with_each_lb_session_as_an_attempt_event(
    rabbitmq_testbed: TestBed, traced: tuple[Any, Any, str]
) -> None:
    provider, exporter, stream = traced
    host, port = rabbitmq_testbed.lb("stream")
    async with Environment(rabbitmq_testbed.stream_uri(host, port), resolver=LoadBalancer(f"{host}:{port}"),
                           telemetry=Telemetry(tracer_provider=provider)) as env:
        before = env.streams.connector.opened
        producer = await env.producer(stream)
        dialled = env.streams.connector.opened - before
        [place] = named(exporter, "smartclient.place")
        attempts = [e for e in place.events if e.name == "attempt"]
        # one event per LB session the placement opened (a hedged second dial is one attempt), the last one
        # accepted on the leader, every earlier one a landing on another node (kept for later)
        assert 1 <= len(attempts) <= dialled
        assert attempts[-1].attributes["smartclient.accepted"] is True
        assert attempts[-1].attributes["smartclient.reported"] == str(producer.node)
        assert all(not e.attributes["smartclient.accepted"] for e in attempts[:-1])
        assert all(e.attributes["smartclient.dialled"] == f"{host}:{port}" for e in attempts)
        assert place.attributes["smartclient.role"] == "producer"
        assert place.attributes["server.node"] == str(producer.node)
        assert place.attributes["messaging.destination.name"] == stream


async def test_publish_frames_and_chunks_are_spans_that_count_every_message(
    rabbitmq_testbed: TestBed, traced: tuple[Any, Any, str]
) -> None:
    provider, exporter, stream = traced
    node = rabbitmq_testbed.nodes[1]
    got: list[int] = []
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port),
                           telemetry=Telemetry(tracer_provider=provider)) as env:
        producer = await env.producer(stream)
        await env.consumer(stream, lambda message, context: got.append(context.offset), offset="first")
        await producer.send_many([b"m%d" % i for i in range(500)])
        await producer.flush()
        await wait_until(lambda: len(got) == 500, 10, "500 messages")
        sends = named(exporter, f"send {stream}")
        assert sum(s.attributes["messaging.batch.message_count"] for s in sends) == 500
        assert all(s.kind.name == "PRODUCER" and s.end_time >= s.start_time for s in sends)
        # roots: made in the connection's tasks, which must not keep the placement's span as their parent
        assert all(s.parent is None for s in sends)
        await wait_until(lambda: sum(s.attributes["messaging.batch.message_count"]
                                     for s in named(exporter, f"process {stream}")) == 500, 5, "chunk spans")
        processes = named(exporter, f"process {stream}")
        assert all(s.kind.name == "CONSUMER" and s.attributes["messaging.operation.type"] == "process"
                   and s.parent is None for s in processes)
        assert not named(exporter, f"create {stream}")  # no span per message without propagation


async def test_a_consumer_span_links_to_its_producer_span_when_propagation_is_on(
    rabbitmq_testbed: TestBed, traced: tuple[Any, Any, str]
) -> None:
    from opentelemetry import trace

    provider, exporter, stream = traced
    node = rabbitmq_testbed.nodes[1]
    inside: list[Any] = []
    uri = rabbitmq_testbed.stream_uri(node.host, node.stream_port)
    traced_messages = Telemetry(tracer_provider=provider, trace_context=True)
    async with Environment(uri, telemetry=traced_messages) as producing, \
            Environment(uri, telemetry=traced_messages) as consuming:
        producer = await producing.producer(stream)
        await consuming.consumer(
            stream, lambda message, context: inside.append(trace.get_current_span().get_span_context()),
            offset="first")
        tracer = provider.get_tracer("the application")
        with tracer.start_as_current_span("order placed") as app:
            await producer.send(b"order 1")
            await producer.send_many([b"order 2", b"order 3"])
        await producer.flush()
        await wait_until(lambda: len(inside) == 3, 10, "3 messages")
        creates = named(exporter, f"create {stream}")
        assert len(creates) == 3
        assert all(c.parent.span_id == app.get_span_context().span_id for c in creates)
        processes = [s for s in named(exporter, f"process {stream}")
                     if "messaging.batch.message_count" not in s.attributes]
        assert len(processes) == 3
        linked = {link.context.span_id for p in processes for link in p.links}
        assert linked == {c.context.span_id for c in creates}
        # the callback ran inside its message's process span
        assert {c.span_id for c in inside} == {p.context.span_id for p in processes}


async def test_without_a_tracer_provider_no_tracing_is_set_up(rabbitmq_testbed: TestBed) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        assert env.streams._carriers.tracing is None
        assert env.streams.connector.on_attempt is None


def test_an_rpc_call_is_a_client_span_and_its_request_a_server_span_on_the_callers_node(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    from smartclient import Address
    from smartclient.amqp.placement import AmqpPlacer
    from smartclient.amqp.rpc import RpcClient, RpcServer

    provider, exporter = tracing()
    exchange = f"{rabbitmq_unique_name}-rpc"
    node = rabbitmq_testbed.nodes[2]
    host, port = rabbitmq_testbed.lb("amqp")
    with rabbitmq_testbed.management() as api:
        through_lb = ClientSettings(resolver=LoadBalancer(Address(host, port), amqp=Address(host, port)))
        placer = AmqpPlacer(api, settings=through_lb)
        with RpcServer(placer, exchange, lambda body, properties: b"re:" + body, nodes=[node.name],
                       tracer_provider=provider) as server:
            server.start()
            with placer.connect(node.short) as placed:
                client = RpcClient(placed, exchange, tracer_provider=provider)
                assert client.call(b"ping").body == b"re:ping"
        api.delete(f"/api/exchanges/%2F/{exchange}")
    [call] = named(exporter, f"send {exchange}")
    [served] = named(exporter, f"process {exchange}")
    assert call.kind.name == "CLIENT" and served.kind.name == "SERVER"
    assert served.parent is not None and served.parent.span_id == call.context.span_id
    assert served.context.trace_id == call.context.trace_id
    assert call.attributes["server.node"] == served.attributes["server.node"] == node.name
    assert call.attributes["smartclient.rpc.replied_by"] == node.name
