"""OpenTelemetry metrics against the test bed, read with the SDK's in-memory reader (issue 19)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import Environment
from smartclient.core.settings import Credentials, Telemetry
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

from ..conftest import wait_until

sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="the OpenTelemetry SDK (smartclient[dev]) is needed")
export = pytest.importorskip("opentelemetry.sdk.metrics.export")


def metric_points(reader: Any) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """instrument name -> [(attributes, value)]: a sum's value, a histogram's count."""
    out: dict[str, list[tuple[dict[str, Any], float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out[metric.name] = [(dict(p.attributes or {}), getattr(p, "value", None) if hasattr(p, "value")
                                     else p.count) for p in metric.data.data_points]
    return out


def total(metrics: dict[str, list[tuple[dict[str, Any], float]]], name: str, **attributes: Any) -> float:
    return sum(v for a, v in metrics.get(name, []) if all(a.get(k) == w for k, w in attributes.items()))


async def test_a_placement_through_the_lb_and_publishing_are_counted(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    reader = export.InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])
    host, port = rabbitmq_testbed.lb("stream")
    stream = rabbitmq_unique_name
    await create_stream_led_by(rabbitmq_testbed, stream, 1)
    got: list[int] = []
    try:
        async with Environment(rabbitmq_testbed.stream_uri(host, port), resolver=LoadBalancer(f"{host}:{port}"),
                               telemetry=Telemetry(meter_provider=provider)) as env:
            producer = await env.producer(stream)
            consumer = await env.consumer(stream, lambda message, context: got.append(context.offset), offset="first")
            for i in range(300):
                await producer.send(b"m%d" % i)
            await producer.flush()
            await wait_until(lambda: len(got) == 300, 10, "300 messages")
            metrics = metric_points(reader)
            on = {"messaging.destination.name": stream}
            assert total(metrics, "rabbitmq.stream.published", **on) == 300
            assert total(metrics, "messaging.client.sent.messages", **on) == 300
            assert total(metrics, "rabbitmq.stream.confirmed", **on) == 300
            assert total(metrics, "rabbitmq.stream.errored", **on) == 0
            assert total(metrics, "rabbitmq.stream.outstanding_publish_confirm", **on) == 0
            assert total(metrics, "rabbitmq.stream.consumed", **on) == 300
            assert total(metrics, "rabbitmq.stream.chunk", **on) >= 1
            # publish to confirm: one sample per confirm frame, at least one, at most one per message
            assert 1 <= total(metrics, "messaging.client.operation.duration", **on) <= 300
            # what only smartclient knows: the LB sessions it opened, the wrong landings among them, where
            # each handle sits, and how long placing took
            assert total(metrics, "smartclient.placement.sessions") == env.streams.connector.opened
            assert total(metrics, "smartclient.placement.mismatches") == sum(env.streams.connector.mismatches.values())
            placed = {(a["server.node"], a["smartclient.role"]): v for a, v in metrics["smartclient.connections"]}
            assert placed == {(str(producer.node), "producer"): 1, (str(consumer.node), "consumer"): 1}
            assert total(metrics, "smartclient.placement.duration") == 2  # two placements, one sample each
            # the LB sessions of each placement: the locator's is the one connection no placement opened
            sessions = [p for m in reader.get_metrics_data().resource_metrics for sc in m.scope_metrics
                        for metric in sc.metrics if metric.name == "smartclient.placement.attempts"
                        for p in metric.data.data_points]
            assert sum(p.count for p in sessions) == 2
            assert sum(p.sum for p in sessions) == env.streams.connector.opened - 1
            await producer.close()
            assert total(metric_points(reader), "rabbitmq.stream.published", **on) == 300  # a closed producer's stay
    finally:
        await delete_streams(rabbitmq_testbed, stream)
        provider.shutdown()


async def test_a_leader_kill_records_one_recovery_its_time_and_the_messages_resent(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    reader = export.InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])
    stream = rabbitmq_unique_name
    await create_stream_led_by(bed, stream, 1)
    try:
        async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes],
                               telemetry=Telemetry(meter_provider=provider)) as env:
            producer = await env.producer(stream, name="observed")
            stop = asyncio.Event()

            async def publish() -> None:
                i = 0
                while not stop.is_set():
                    await producer.send(b"m%d" % i)
                    i += 1
                    await asyncio.sleep(0.002)

            task = asyncio.create_task(publish())
            await wait_until(lambda: producer.buffer is not None and producer.buffer.confirmed > 200, 10, "confirms")
            bed.kill_node(bed.nodes[1].name)  # the leader, by PID
            await wait_until(lambda: producer.recoveries >= 1, 30, "the producer to recover")
            stop.set()
            await task
            await producer.flush()
            metrics = metric_points(reader)
            on = {"messaging.destination.name": stream}
            assert total(metrics, "smartclient.recoveries", **on) == producer.recoveries == 1
            assert total(metrics, "smartclient.recovery.duration", **on, **{"smartclient.outcome": "recovered"}) == 1
            assert total(metrics, "smartclient.recovery.resent", **on) == producer.buffer.resent
            assert total(metrics, "rabbitmq.stream.outstanding_publish_confirm", **on) == 0
    finally:
        bed.heal()
        await delete_streams(bed, stream)
        provider.shutdown()


async def test_dns_lookups_resolution_times_and_amqp_and_mqtt_clients_per_node_are_recorded(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    import uuid

    from resolvers import DnsResolver, SrvDiscovery

    bed = rabbitmq_testbed
    reader = export.InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])
    host, port = bed.dns_address
    dns = DnsResolver([host], port=port)
    await create_stream_led_by(bed, rabbitmq_unique_name, 2)
    try:
        # the SRV targets are rabbit-N.smartclient.test names: each connection to one asks the DNS resolver
        async with Environment(SrvDiscovery("_rabbitmq-stream._tcp.smartclient.test", [host], port=port),
                               credentials=Credentials(bed.username, bed.password), resolver=dns,
                               management=bed.management(), telemetry=Telemetry(meter_provider=provider)) as env:
            await env.producer(rabbitmq_unique_name)
            amqp = env.amqp_connection(bed.nodes[1].name)
            amqp10 = env.amqp10.connect(bed.nodes[0].name)
            mqtt = env.mqtt_client(f"observed-{uuid.uuid4().hex[:6]}", bed.nodes[2].name)
            try:
                metrics = metric_points(reader)
                assert dns.lookups >= 1
                assert total(metrics, "smartclient.dns.lookups", **{"smartclient.cache": "miss"}) == dns.lookups
                assert total(metrics, "smartclient.dns.lookups", **{"smartclient.cache": "hit"}) == dns.cache_hits
                # one resolver call per connection dialled: the stream ones, and the AMQP and MQTT placers' own
                assert total(metrics, "smartclient.resolution.duration",
                              **{"smartclient.resolver": "DnsResolver"}) >= env.streams.connector.opened + 3
                clients = {(a["network.protocol.name"], a.get("network.protocol.version", ""), a["server.node"]): v
                           for a, v in metrics["smartclient.clients"]}
                assert clients == {("amqp", "", bed.nodes[1].name): 1, ("amqp", "1.0", bed.nodes[0].name): 1,
                                   ("mqtt", "", bed.nodes[2].name): 1}
            finally:
                amqp.close()
                amqp10.close()
                mqtt.disconnect()
                mqtt.loop_stop()
            await wait_until(lambda: not metric_points(reader).get("smartclient.clients"), 5, "no client left")
    finally:
        await delete_streams(bed, rabbitmq_unique_name)
        provider.shutdown()


async def test_two_environments_on_one_meter_provider_each_count_and_a_closed_one_keeps_its_totals(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """The SDK hands the second Environment the first one's instruments (same meter, same names): the readings
    add up every live Environment, and what a closed one counted stays counted."""
    reader = export.InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])
    node = rabbitmq_testbed.nodes[0]
    streams = [f"{rabbitmq_unique_name}-{i}" for i in (1, 2)]
    try:
        first = Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port),
                            telemetry=Telemetry(meter_provider=provider))
        async with first, Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port),
                                      telemetry=Telemetry(meter_provider=provider)) as second:
            for env, stream, count in ((first, streams[0], 100), (second, streams[1], 70)):
                await env.create_stream(stream)
                producer = await env.producer(stream)
                await producer.send_many([b"m"] * count)
                await producer.flush()
            metrics = metric_points(reader)
            assert [total(metrics, "rabbitmq.stream.published", **{"messaging.destination.name": s})
                    for s in streams] == [100, 70]
            assert total(metrics, "rabbitmq.stream.connections") >= 2
        metrics = metric_points(reader)  # both closed: their totals stay, their connections go
        assert [total(metrics, "rabbitmq.stream.confirmed", **{"messaging.destination.name": s})
                for s in streams] == [100, 70]
        assert total(metrics, "rabbitmq.stream.connections") == 0
    finally:
        await delete_streams(rabbitmq_testbed, *streams)
        provider.shutdown()
