"""bench/amqp10.py: AMQP 1.0 publish-to-accept throughput and latency to a quorum queue, placed on its leader
against placed on a follower, in one run (issue 34).

A quorum queue (three members) gets ``--messages`` 100-byte messages per phase, each published and waited for
(the official client's only way: one message in flight), so a phase's msg/s is one over the round trip and its
percentiles are those of each publish call:

* **placed on the leader**: ``Amqp10Placer.publisher(queue)`` through the round-robin load balancer;
* **placed on a follower**: a connection placed on a follower (where the official client lands two times in
  three behind a round-robin load balancer), publishing the same way;
* **the official client alone** (the anchor): ``rabbitmq_amqp_python_client.Connection`` on the load balancer,
  no smartclient, wherever it lands (its node is printed).

Phases alternate over ``--rounds`` rounds.  The verdict is on the medians of the rounds' own ratios: placed on
the leader at least the follower's msg/s, and at most its p99.
Run from the repository root with the test bed up: python bench/amqp10.py [--messages N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from resolvers import LoadBalancer
from smartclient import Address, ClientSettings
from smartclient.amqp10.placement import Amqp10Placer
from smartclient.testing.local import LocalTestBed

BODY = bytes(100)


def timed(publish: Callable[[bytes], None], messages: int) -> tuple[float, float, float]:
    """msg/s, p50 and p99 (ms) of ``messages`` publishes."""
    took: list[float] = []
    began = time.perf_counter()
    for _ in range(messages):
        start = time.perf_counter()
        publish(BODY)
        took.append(time.perf_counter() - start)
    elapsed = time.perf_counter() - began
    took.sort()
    return messages / elapsed, took[len(took) // 2] * 1e3, took[min(len(took) - 1, int(len(took) * 0.99))] * 1e3


def official_alone(host: str, port: int, queue: str, user: str, password: str) -> tuple[Any, Any, str]:
    from rabbitmq_amqp_python_client import AddressHelper, Connection, Message

    connection = Connection(uri=f"amqp://{user}:{password}@{host}:{port}/")
    connection.dial()
    publisher = connection.publisher(AddressHelper.queue_address(queue))
    node = str((connection._conn.conn.remote_properties or {}).get("node"))  # only to print where it landed

    def publish(body: bytes) -> None:
        publisher.publish(Message(body=body))

    return connection, publish, node


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bed = LocalTestBed.from_env()
    bed.up()
    host, port = bed.lb("amqp")
    queue = f"bench-amqp10-{uuid.uuid4().hex[:6]}"
    with bed.management() as api:
        api.put(f"/api/queues/%2F/{queue}", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        through_lb = ClientSettings(resolver=LoadBalancer(Address(host, port), amqp=Address(host, port)))
        placer = Amqp10Placer(api, settings=through_lb)
        try:
            topology = placer.queue_topology(queue)
            follower = next(m for m in topology.members if m != topology.leader)
            leader_publisher = placer.publisher(queue)
            from smartclient.amqp10._rabbitmq_amqp import new_publisher, publish

            placed = placer.connect(follower, "bench")
            on_follower = new_publisher(placed.connection, queue)
            alone, alone_publish, alone_node = official_alone(host, port, queue, bed.username, bed.password)
            phases: dict[str, Callable[[bytes], None]] = {
                f"placed on the leader ({leader_publisher.node})": leader_publisher.publish,
                f"placed on a follower ({follower})": lambda body: publish(on_follower, body, queue),
                f"the official client alone ({alone_node})": alone_publish,
            }
            for publish_one in phases.values():  # warm each connection
                timed(publish_one, 200)
            results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in phases}
            for round_no in range(1, args.rounds + 1):
                for name, publish_one in phases.items():
                    results[name].append(timed(publish_one, args.messages))
                print(f"round {round_no}: " + ", ".join(
                    f"{name.split(' (')[0]} {results[name][-1][0]:,.0f} msg/s p99 {results[name][-1][2]:.2f} ms"
                    for name in phases), flush=True)
            leader_publisher.close()
            placed.close()
            alone.close()
        finally:
            placer.close()
            api.delete(f"/api/queues/%2F/{queue}")
    print()
    for name, rows in results.items():
        rate = statistics.median(r[0] for r in rows)
        p50 = statistics.median(r[1] for r in rows)
        p99 = statistics.median(r[2] for r in rows)
        print(f"{name:<48} {rate:8,.0f} msg/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    lead, follow = (results[name] for name in list(phases)[:2])
    rate_ratio = statistics.median(a[0] / b[0] for a, b in zip(lead, follow, strict=True))
    p99_ratio = statistics.median(a[2] / b[2] for a, b in zip(lead, follow, strict=True))
    ok = rate_ratio >= 1.0 and p99_ratio <= 1.0
    print(f"amqp10: leader_vs_follower_rate={rate_ratio:.2f} target >= 1.0 and "
          f"leader_vs_follower_p99={p99_ratio:.2f} target <= 1.0 {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
