"""``smartclient top`` against a service's real Prometheus endpoint (the OpenTelemetry Prometheus exporter)."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import Environment
from smartclient.core.settings import Telemetry
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

from ..conftest import wait_until

sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="the OpenTelemetry SDK (smartclient[dev]) is needed")
exporter = pytest.importorskip("opentelemetry.exporter.prometheus",
                               reason="opentelemetry-exporter-prometheus (smartclient[dev]) is needed")
prometheus = pytest.importorskip("prometheus_client")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def endpoint() -> Iterator[tuple[str, Any]]:
    """A service's Prometheus endpoint: its URL, and the meter provider whose metrics it serves."""
    port = free_port()
    server, _thread = prometheus.start_http_server(port, addr="127.0.0.1")
    provider = sdk.MeterProvider(metric_readers=[exporter.PrometheusMetricReader()])
    try:
        yield f"http://127.0.0.1:{port}/metrics", provider
    finally:
        provider.shutdown()
        server.shutdown()


async def top(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "smartclient.cli", "top", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_top_shows_where_the_handles_sit_and_the_publish_rate_of_a_live_service(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, endpoint: tuple[str, Any]
) -> None:
    url, provider = endpoint
    host, lb_port = rabbitmq_testbed.lb("stream")
    stream = rabbitmq_unique_name
    await create_stream_led_by(rabbitmq_testbed, stream, 2)
    stop = asyncio.Event()
    try:
        async with Environment(rabbitmq_testbed.stream_uri(host, lb_port), resolver=LoadBalancer(f"{host}:{lb_port}"),
                               telemetry=Telemetry(meter_provider=provider)) as env:
            producer = await env.producer(stream)
            consumer = await env.consumer(stream, lambda message, context: None, offset="first")

            async def publish() -> None:
                while not stop.is_set():
                    await producer.send_many([b"x" * 50] * 200)
                    await asyncio.sleep(0.01)

            task = asyncio.create_task(publish())
            code, out, err = await top("--metrics", url, "--once", "--interval", "1")
            stop.set()
            await task
            assert code == 0, err
            print(out)
            assert f"{producer.node}" in out and f"{consumer.node}" in out
            [producer_row] = [line for line in out.splitlines() if str(producer.node) in line and "producer" in line]
            assert producer_row.split()[-1] == "1"
            streams = out[out.index("STREAMS"):out.index("CONSUMERS")].splitlines()
            [row] = [line for line in streams if stream in line]
            publish_rate = row.split()[2]
            assert publish_rate.endswith("/s") and int(publish_rate[:-2].replace(",", "")) > 0
            assert "LB sessions" in out and "\x1b[" not in out
    finally:
        stop.set()
        await delete_streams(rabbitmq_testbed, stream)


async def test_top_shows_the_lag_of_a_consumer_held_in_its_callback(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, endpoint: tuple[str, Any]
) -> None:
    url, provider = endpoint
    bed, stream = rabbitmq_testbed, rabbitmq_unique_name
    await create_stream_led_by(bed, stream, 0)
    gate = asyncio.Event()

    async def held(message: object, context: object) -> None:
        await gate.wait()

    try:
        async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes],
                               telemetry=Telemetry(meter_provider=provider)) as env:
            producer = await env.producer(stream)
            consumer = await env.consumer(stream, held, offset="first", name="billing")
            await producer.send_many([b"x" * 50] * 1200)
            await producer.flush()
            await wait_until(lambda: consumer.lag == 1200, 30, lambda: f"a lag of 1200, not {consumer.lag}")
            code, out, err = await top("--metrics", url, "--once", "--interval", "0.2")
            print(out)
            assert code == 0, err
            consumers = out[out.index("CONSUMERS"):].splitlines()
            [row] = [line for line in consumers if stream in line]
            assert row.split() == [stream, "billing", "1,200"]
            gate.set()
    finally:
        gate.set()
        await delete_streams(bed, stream)


async def test_top_shows_a_super_streams_partitions_and_marks_the_one_whose_consumer_falls_behind(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, endpoint: tuple[str, Any]
) -> None:
    url, provider = endpoint
    bed, name = rabbitmq_testbed, rabbitmq_unique_name
    gate = asyncio.Event()

    async def held(message: object, context: object) -> None:
        if bytes(message) == b"hold":  # (only partition 2's messages say so)
            await gate.wait()

    async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes],
                           telemetry=Telemetry(meter_provider=provider)) as env:
        partitions = await env.create_super_stream(name, partitions=4)
        try:
            consumer = await env.super_stream_consumer(name, held, offset="first", name="billing")
            for index, partition in enumerate(partitions):
                producer = await env.producer(partition)
                await producer.send_many([b"hold" if index == 2 else b"x"] * 500)
                await producer.flush()
                await producer.close()
            held_one = consumer.consumers[partitions[2]]
            await wait_until(lambda: held_one.lag == 500, 30, lambda: f"a lag of 500, not {held_one.lag}")
            code, out, err = await top("--metrics", url, "--once", "--interval", "0.2")
            print(out)
            assert code == 0, err
            section = out[out.index("SUPER STREAM"):out.index("PLACEMENT")].splitlines()
            assert section[0].startswith(f"SUPER STREAM  {name}: 4 partitions, lag median 0, highest 500; 1 behind")
            assert section[2].split() == [partitions[2], "500", "BEHIND"]
            assert sorted(line.split()[0] for line in section[3:6]) == sorted(set(partitions) - {partitions[2]})
            assert re.search(r"stream connections open: \d+ \(\S+:\d+ \d+", out)  # and by node
        finally:
            gate.set()
            await env.delete_super_stream(name, missing_ok=True)


async def test_top_says_when_the_endpoint_does_not_answer() -> None:
    code, out, err = await top("--metrics", f"http://127.0.0.1:{free_port()}/metrics", "--once", "--interval", "0.1")
    assert code == 2 and "could not read" in err and out == ""
    code, _, err = await top("--metrics", "localhost:9464", "--once")
    assert code == 2 and "ConfigurationError" in err
