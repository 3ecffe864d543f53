"""Observability: what an operator reads after a placement through the load balancer and a failover.

    python examples/observability.py          # against the local test bed (./dev demo starts it)

It places a named producer and a consumer through the test bed's round-robin HAProxy with OpenTelemetry's
SDK wired in (an in-memory metric reader and span exporter stand in for Prometheus and a trace backend),
publishes, moves the stream's leader to another node (a failover: the producer recovers on the new
leader and sends its unconfirmed messages again), publishes again, and prints:

- every smartclient metric with its attributes and value;
- the placement spans, each attempt through the LB as an event (dialled, reported node, outcome).

Exit status 0 when the metrics account for every message and the failover was recorded.
Needs ``pip install smartclient[otel] opentelemetry-sdk`` and the test bed (``smartclient.testing``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from resolvers import LoadBalancer
from smartclient import Environment, parse_stream_uri
from smartclient.core.settings import Telemetry
from smartclient.testing import from_env

DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:20052/"  # the test bed's round-robin HAProxy
MESSAGES = 2000


def metrics_of(reader: InMemoryMetricReader) -> list[tuple[str, dict[str, Any], float]]:
    """(name, attributes, value) of every data point: a sum's value, a histogram's count."""
    out = []
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = point.value if hasattr(point, "value") else point.count
                    out.append((metric.name, dict(point.attributes or {}), value))
    return out


async def wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {seconds} s")
        await asyncio.sleep(0.05)


async def main() -> int:
    uri = os.environ.get("SMARTCLIENT_URI", DEFAULT_URI)
    bed = from_env()
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    traces = TracerProvider()
    traces.add_span_processor(SimpleSpanProcessor(spans))
    stream = f"smartclient-observability-{uuid.uuid4().hex[:6]}"
    got: list[int] = []
    async with Environment(uri, resolver=LoadBalancer(parse_stream_uri(uri).address),
                           telemetry=Telemetry(meter_provider=meters, tracer_provider=traces)) as env:
        await env.create_stream(stream, {"initial-cluster-size": 3})
        try:
            producer = await env.producer(stream, name="observed")
            await env.consumer(stream, lambda message, context: got.append(context.offset), offset="first")
            await producer.send_many([b"before %d" % i for i in range(MESSAGES)])
            await producer.flush()
            leader = (await env.topology(stream)).leader
            target = next(n.name for n in bed.nodes if n.advertised[1] != leader.port)
            print(f"moving the leader of {stream} off {leader} to {target} ...")
            await asyncio.to_thread(bed.move_leader, stream, target)
            await producer.send_many([b"after %d" % i for i in range(MESSAGES)])
            await wait_for(lambda: producer.recoveries >= 1, 60, "the producer's recovery")
            await producer.flush()
            await wait_for(lambda: len(got) >= 2 * MESSAGES, 30, "every message consumed")
            points = metrics_of(reader)  # while the producer and consumer are still placed
        finally:
            await env.delete_stream(stream, missing_ok=True)

    print(f"\n{'METRIC':<46} {'ATTRIBUTES':<70} VALUE")
    for name, attributes, value in sorted(points, key=lambda p: (p[0], sorted(p[1].items()))):
        shown = ", ".join(f"{k}={v}" for k, v in sorted(attributes.items()) if k != "messaging.system")
        print(f"{name:<46} {shown:<70} {value:g}")

    print("\nplacements (span smartclient.place, one event per connection through the LB):")
    for span in spans.get_finished_spans():
        if span.name == "smartclient.place":
            attributes = span.attributes or {}
            print(f"  {attributes.get('smartclient.role')} of {attributes.get('messaging.destination.name')} "
                  f"-> {attributes.get('server.node')}")
            for event in span.events:
                e = event.attributes or {}
                print(f"    dialled {e.get('smartclient.dialled')}, reached {e.get('smartclient.reported') or '-'}: "
                      f"{e.get('smartclient.outcome')}")

    def total(name: str) -> float:
        return sum(v for n, a, v in points if n == name and a.get("messaging.destination.name") == stream)

    problems = []
    if total("rabbitmq.stream.confirmed") != 2 * MESSAGES:
        problems.append(f"{total('rabbitmq.stream.confirmed'):g} confirmed, not {2 * MESSAGES}")
    if total("smartclient.recoveries") < 1 or total("smartclient.recovery.duration") < 1:
        problems.append("the failover was not recorded")
    if total("rabbitmq.stream.outstanding_publish_confirm") != 0:
        problems.append("messages still wait for a confirm")
    meters.shutdown()
    traces.shutdown()
    if problems:
        print("\nMETRICS WRONG: " + "; ".join(problems))
        return 1
    print(f"\nmetrics OK: {2 * MESSAGES} published and confirmed, {total('smartclient.recoveries'):g} recoveries "
          f"({total('smartclient.recovery.resent'):g} message(s) sent again), nothing outstanding")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
