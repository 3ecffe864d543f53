"""bench/rpc_latency.py: request/reply latency, local random exchange vs a classic queue on another node.

Seed 002 claims the local random exchange (``x-local-random``) gives the lowest RPC latency, because the
request never leaves the node it was published on.  Measured side by side in the same run, with pika:

* **local**: the client on node 1 calls over ``x-local-random``; smartclient's RpcServer has a server
  on every node, so the one on node 1 answers;
* **remote**: the client on node 1 publishes to a classic queue declared on node 2, whose only server
  is on node 2 (the request and the reply each cross the cluster link).

Both use direct reply-to and one request in flight.  Prints p50 and p99 of each, and the ratio
remote/local of the p50s.  Target: remote p50 / local p50 >= 1 (the seed's claim holds).
Run from the repository root with the test bed up (./dev demo): python bench/rpc_latency.py
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import uuid
from typing import Any

from smartclient.amqp.placement import AmqpPlacer
from smartclient.amqp.rpc import RpcClient, RpcServer
from smartclient.testing.local import LocalTestBed

CALLS = 2000
WARMUP = 200
TARGET = 1.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_local(placer: AmqpPlacer, exchange: str, node: str) -> list[float]:
    with placer.connect(node) as placed:
        client = RpcClient(placed, exchange)
        for _ in range(WARMUP):
            client.call(b"w")
        samples = []
        for i in range(CALLS):
            started = time.perf_counter()
            client.call(b"%d" % i)
            samples.append(time.perf_counter() - started)
        return samples


def classic_server(placer: AmqpPlacer, queue: str, node: str, ready: threading.Event, stop: threading.Event) -> None:
    import pika

    with placer.connect(node) as placed:
        channel = placed.channel()
        channel.queue_declare(queue, exclusive=True, auto_delete=True)  # exclusive: it lives on `node`

        def on_request(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            ch.basic_publish("", properties.reply_to, b"echo:" + body,
                             pika.BasicProperties(correlation_id=properties.correlation_id))
            ch.basic_ack(method.delivery_tag)

        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(queue, on_request)
        ready.set()
        while not stop.is_set():
            placed.connection.process_data_events(time_limit=0.1)


def measure_remote(placer: AmqpPlacer, queue: str, node: str) -> list[float]:
    import pika

    with placer.connect(node) as placed:
        channel = placed.channel()
        replies: dict[str, bytes] = {}
        channel.basic_consume("amq.rabbitmq.reply-to",
                              lambda ch, m, p, body: replies.__setitem__(p.correlation_id, body), auto_ack=True)

        def call(body: bytes) -> None:
            correlation_id = uuid.uuid4().hex
            channel.basic_publish("", queue, body, pika.BasicProperties(reply_to="amq.rabbitmq.reply-to",
                                                                        correlation_id=correlation_id))
            while correlation_id not in replies:
                placed.connection.process_data_events(time_limit=0.5)
            del replies[correlation_id]

        for _ in range(WARMUP):
            call(b"w")
        samples = []
        for i in range(CALLS):
            started = time.perf_counter()
            call(b"%d" % i)
            samples.append(time.perf_counter() - started)
        return samples


def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    caller, other = bed.nodes[0].name, bed.nodes[1].name
    with bed.management() as api:
        placer = AmqpPlacer(api)
        exchange = f"bench-rpc-{uuid.uuid4().hex[:8]}"
        queue = f"bench-rpc-classic-{uuid.uuid4().hex[:8]}"
        ready, stop = threading.Event(), threading.Event()
        server = threading.Thread(target=classic_server, args=(placer, queue, other, ready, stop), daemon=True)
        server.start()
        ready.wait(30)
        results: dict[str, list[float]] = {"local": [], "remote": []}
        with RpcServer(placer, exchange, lambda body, props: b"echo:" + body) as rpc:
            print(rpc.start())
            for round_no in range(2):  # alternate, so that neither always runs on a warmer machine
                order = ["local", "remote"] if round_no == 0 else ["remote", "local"]
                for mode in order:
                    if mode == "local":
                        results[mode] += measure_local(placer, exchange, caller)
                    else:
                        results[mode] += measure_remote(placer, queue, caller)
        stop.set()
        server.join(5)
        api.delete(f"/api/exchanges/%2F/{exchange}")
    for mode, samples in results.items():
        print(f"{mode:<6}: {len(samples)} calls, p50 {percentile(samples, 0.5) * 1e3:.3f} ms, "
              f"p99 {percentile(samples, 0.99) * 1e3:.3f} ms, mean {statistics.mean(samples) * 1e3:.3f} ms")
    ratio = percentile(results["remote"], 0.5) / percentile(results["local"], 0.5)
    p99 = percentile(results["remote"], 0.99) / percentile(results["local"], 0.99)
    print(f"remote/local: p50 {ratio:.2f}x, p99 {p99:.2f}x")
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"rpc_latency: remote_over_local_p50={ratio:.2f} target >= {TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
