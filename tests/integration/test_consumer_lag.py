"""Consumer lag against the test bed: a consumer held in its callback while a producer publishes falls behind by
exactly what was published, one beside it that keeps up reads 0, and the held one comes back to 0 once let go;
``Consumer.lag`` and the ``smartclient.consumer.lag`` gauge say the same."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from smartclient import Environment, OffsetTracking
from smartclient.core.settings import Telemetry
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

from ..conftest import wait_until

sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="the OpenTelemetry SDK (smartclient[dev]) is needed")
export = pytest.importorskip("opentelemetry.sdk.metrics.export")

SAMPLED = 30.0  # seconds a lag may take to show: a sample every 5 s, each a StreamStats on the leader


def gauge(reader: Any, stream: str) -> dict[str | None, float]:
    """The lag gauge of ``stream``: consumer name (None: unnamed) -> lag."""
    data = reader.get_metrics_data()
    return {p.attributes.get("messaging.consumer.group.name"): p.value
            for resource in (data.resource_metrics if data else ()) for scope in resource.scope_metrics
            for metric in scope.metrics if metric.name == "smartclient.consumer.lag"
            for p in metric.data.data_points if p.attributes.get("messaging.destination.name") == stream}


async def test_a_held_consumer_falls_behind_by_what_is_published_and_returns_to_0_once_let_go(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed, stream = rabbitmq_testbed, rabbitmq_unique_name
    reader = export.InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[reader])
    await create_stream_led_by(bed, stream, 1)
    gate = asyncio.Event()
    handed: list[int] = []

    async def held(message: Any, context: Any) -> None:  # blocks on the first message until let go
        await gate.wait()
        handed.append(context.offset)

    try:
        async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes],
                               telemetry=Telemetry(meter_provider=provider)) as env:
            producer = await env.producer(stream)
            await producer.send_many([b"before"] * 500)
            await producer.flush()
            lagging = await env.consumer(stream, held, offset="first", name="lagging")
            keeping_up = await env.consumer(stream, lambda message, context: None, offset="first")
            assert lagging.lag is None  # the first read starts the sampling
            await wait_until(lambda: lagging.lag == 500 and keeping_up.lag == 0, SAMPLED,
                             lambda: f"lags 500 and 0, not {lagging.lag} and {keeping_up.lag}")
            seen = [lagging.lag]
            await producer.send_many([b"while held"] * 2500)
            await producer.flush()
            await wait_until(lambda: lagging.lag == 3000 and keeping_up.lag == 0, SAMPLED,
                             lambda: f"lags 3000 and 0, not {lagging.lag} and {keeping_up.lag}")
            seen.append(lagging.lag)
            assert gauge(reader, stream) == {"lagging": 3000, None: 0}
            assert handed == [] and lagging.waiting_for == 0
            gate.set()
            await wait_until(lambda: len(handed) == 3000, 30, lambda: f"3000 messages handed, not {len(handed)}")
            await wait_until(lambda: lagging.lag == 0, SAMPLED, lambda: f"a lag of 0, not {lagging.lag}")
            seen.append(lagging.lag)
            assert gauge(reader, stream) == {"lagging": 0, None: 0}
            print(f"lag of the held consumer: {seen}")
            await lagging.close()
            assert lagging.lag is None
            await wait_until(lambda: "lagging" not in gauge(reader, stream), SAMPLED, "the closed consumer's lag to go")
    finally:
        await delete_streams(bed, stream)
        provider.shutdown()


async def test_a_tracked_consumer_that_caught_up_reads_0_though_its_stores_are_chunks_of_the_stream(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """Offset tracking writes its stores into the stream as chunks of their own, which take no offset: they
    do not count as messages a consumer has yet to see."""
    bed, stream = rabbitmq_testbed, rabbitmq_unique_name
    await create_stream_led_by(bed, stream, 0)
    try:
        async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]) as env:
            producer = await env.producer(stream)
            await producer.send_many([b"m"] * 1000)
            await producer.flush()
            consumer = await env.consumer(stream, lambda message, context: None, offset="first", name="tracked",
                                          tracking=OffsetTracking(every=100))
            await wait_until(lambda: consumer.last_offset == 999, 30, "the 1000 messages")
            await wait_until(consumer.stored_offset, 30, "a stored offset")
            await wait_until(lambda: consumer.lag == 0, SAMPLED, lambda: f"a lag of 0, not {consumer.lag}")
            stats = await env.stream_stats(stream)
            assert stats["committed_offset"] >= 1000 > consumer.last_offset  # the stores took offsets after 999
    finally:
        await delete_streams(bed, stream)


def test_the_sync_face_reads_the_lag_from_the_caller_s_thread(rabbitmq_testbed: TestBed,
                                                              rabbitmq_unique_name: str) -> None:
    from smartclient.sync import SyncEnvironment

    from ..conftest import wait_until_sync

    bed, stream = rabbitmq_testbed, rabbitmq_unique_name
    node = bed.nodes[2]
    with SyncEnvironment(bed.stream_uri(node.host, node.stream_port)) as env:
        env.create_stream(stream)
        try:
            producer = env.producer(stream)
            producer.send_many([b"m"] * 200)
            producer.flush()
            handed: list[int] = []
            consumer = env.consumer(stream, lambda message, context: handed.append(context.offset), offset="first")
            wait_until_sync(lambda: len(handed) == 200, 30, "the 200 messages")
            wait_until_sync(lambda: consumer.lag == 0, SAMPLED, lambda: f"a lag of 0, not {consumer.lag}")
        finally:
            env.delete_stream(stream, missing_ok=True)
