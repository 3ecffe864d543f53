"""bench/lb_placement.py: placing through a round-robin load balancer, smartclient beside rstream.

Scenario (issue 3): 3 streams whose leaders sit on the 3 different nodes; on each, 1 producer and 2
consumers, all through the test bed's round-robin HAProxy.  Both clients are used the natural way:
smartclient through one Environment with the LoadBalancer resolver; rstream with ``load_balancer_mode``,
one Producer for the three streams and two Consumers (rstream allows one subscription per stream and
Consumer).  For each, side by side and over several rounds:

* LB sessions: the stream listener's session count from HAProxy's stats, before and after;
* the minimum: the distinct connections the final placement uses, plus one metadata connection;
* the time until every placement is ready;
* whether each producer is on its leader and each consumer on a replica, and the two consumers of a
  stream on different replicas.

Target: smartclient opens at most 1.2x its minimum number of sessions (worst round).
Run from the repository root with the test bed up (./dev demo): python bench/lb_placement.py
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from resolvers import LoadBalancer
from smartclient import Address, Environment
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, stream_members

ROUNDS = 3
TARGET = 1.2
LISTENER = "stream_roundrobin"


@dataclass
class Result:
    sessions: int
    minimum: int
    seconds: float
    producers_on_leader: int
    consumers_on_replica: int
    streams_spread: int

    @property
    def ratio(self) -> float:
        return self.sessions / self.minimum


def score(bed: LocalTestBed, streams: list[str], placed: dict[str, tuple[Address, list[Address]]]) -> tuple[int, ...]:
    on_leader = on_replica = spread = 0
    for stream in streams:
        leader, replicas = stream_members(bed, stream)
        producer, consumers = placed[stream]
        on_leader += producer == leader
        on_replica += sum(c in replicas for c in consumers)
        spread += len(set(consumers)) == len(consumers) and set(consumers) <= replicas
    return on_leader, on_replica, spread


async def run_smartclient(bed: LocalTestBed, streams: list[str]) -> Result:
    host, port = bed.lb("stream")
    before = bed.haproxy.sessions(LISTENER)
    started = time.monotonic()
    async with Environment(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port))) as env:
        placed: dict[str, tuple[Address, list[Address]]] = {}
        for stream in streams:
            producer = await env.producer(stream)
            consumers = [await env.consumer(stream, lambda m, c: None) for _ in range(2)]
            placed[stream] = (producer.node, [c.node for c in consumers])  # type: ignore[misc]
        seconds = time.monotonic() - started
        sessions = bed.haproxy.sessions(LISTENER) - before
        minimum = len({r.connection for r in env.placements()}) + 1
    return Result(sessions, minimum, seconds, *score(bed, streams, placed))


async def run_rstream(bed: LocalTestBed, streams: list[str]) -> Result:
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    host, port = bed.lb("stream")
    kwargs: dict[str, Any] = dict(username=bed.username, password=bed.password, load_balancer_mode=True)
    before = bed.haproxy.sessions(LISTENER)
    started = time.monotonic()
    producer = Producer(host, port, **kwargs)
    consumers = [Consumer(host, port, **kwargs) for _ in range(2)]
    placed: dict[str, tuple[Address, list[Address]]] = {}
    try:
        for stream in streams:
            await producer._get_or_create_publisher(stream)  # what its first send() does
            for consumer in consumers:
                await consumer.subscribe(stream, lambda m, c: None,
                                         offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT))

            def node(client: Any) -> Address:
                props = client.server_properties
                return Address(props["advertised_host"], int(props["advertised_port"]))

            placed[stream] = (node(producer._clients[stream]), [node(c._clients[stream]) for c in consumers])
        seconds = time.monotonic() - started
        sessions = bed.haproxy.sessions(LISTENER) - before
        used = {id(c) for c in producer._clients.values()}
        for consumer in consumers:
            used |= {id(c) for c in consumer._clients.values()}
        minimum = len(used) + 1
    finally:
        await producer.close()
        for consumer in consumers:
            await consumer.close()
    return Result(sessions, minimum, seconds, *score(bed, streams, placed))


def show(name: str, r: Result) -> None:
    print(f"  {name:<12} sessions {r.sessions:>3}  minimum {r.minimum:>2}  ratio {r.ratio:4.2f}  "
          f"ready in {r.seconds:5.2f}s  producers on leader {r.producers_on_leader}/3  "
          f"consumers on replicas {r.consumers_on_replica}/6  spread {r.streams_spread}/3")


async def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    worst = 0.0
    totals: dict[str, list[Result]] = {"smartclient": [], "rstream": []}
    for round_no in range(1, ROUNDS + 1):
        streams = [f"bench-lb-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
        for i, stream in enumerate(streams):
            await create_stream_led_by(bed, stream, i)
        try:
            print(f"round {round_no}:")
            ours = await run_smartclient(bed, streams)
            await asyncio.sleep(0.5)
            theirs = await run_rstream(bed, streams)
            show("smartclient", ours)
            show("rstream", theirs)
            totals["smartclient"].append(ours)
            totals["rstream"].append(theirs)
            worst = max(worst, ours.ratio)
        finally:
            await delete_streams(bed, *streams)
    for name, results in totals.items():
        n = len(results)
        print(f"mean {name:<12} sessions {sum(r.sessions for r in results) / n:5.1f}  "
              f"ratio {sum(r.ratio for r in results) / n:4.2f}  ready in {sum(r.seconds for r in results) / n:5.2f}s")
    verdict = "PASS" if worst <= TARGET else "MISS"
    print(f"lb_placement: session_ratio={worst:.2f} target <= {TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
