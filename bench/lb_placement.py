"""bench/lb_placement.py: placing through a round-robin load balancer, smartclient beside rstream.

Two workloads, each on 3 streams whose leaders sit on the 3 different nodes, all through the test bed's
round-robin HAProxy:

* ``small``: on each stream 1 producer and 2 consumers (issue 3);
* ``shared``: 5 producers and 20 consumers over the 3 streams (issue 15): the connections must grow with
  the nodes, not with the producers and consumers.

Both clients are used the natural way: smartclient through one Environment with the LoadBalancer resolver;
rstream with ``load_balancer_mode``, as few Producers and Consumers as it allows (one publisher and one
subscription per stream and object).  For each, side by side and over several rounds:

* LB sessions: the stream listener's session count from HAProxy's stats, before and after;
* connections: those the final placement uses;
* the minimum: one connection per (role, node) the placements need, plus one metadata connection (for
  rstream, which cannot share, the connections it uses plus one);
* the time until every placement is ready;
* whether each producer is on its leader and each consumer on a replica.

Target: smartclient opens at most 1.2x its minimum number of sessions, on both workloads (worst round).

The SNI workload (issue 31): the same placements through the bed's SNI ingress (HAProxy routing TLS by the name
in its hello, ``resolvers.SniRouter``), where each connection sends its node's name and should land on the first
try: sessions / minimum (expected 1.00), wrong landings (expected 0), and the time until every placement is
ready against smartclient through the round-robin LB over TLS in the same round (both TLS, so both pay the
same handshakes; the nodes advertise their ``rabbit-N.smartclient.test`` names meanwhile).  Printed before the
verdict, which stays the round-robin one.

Run from the repository root with the test bed up (./dev demo): python bench/lb_placement.py
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from resolvers import LoadBalancer, SniRouter
from smartclient import Address, Environment
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, stream_members

ROUNDS = 3
TARGET = 1.2
LISTENER = "stream_roundrobin"


@dataclass
class Result:
    sessions: int
    connections: int
    minimum: int
    seconds: float
    producers_on_leader: int
    consumers_on_replica: int
    wrong: int | None = None  # connections that reached another node than the one aimed at (smartclient's count)

    @property
    def ratio(self) -> float:
        return self.sessions / self.minimum


@dataclass(frozen=True)
class Workload:
    name: str
    producers: int  # over the 3 streams, round-robin
    consumers: int

    def per_stream(self, count: int, stream: int) -> int:
        return count // 3 + (stream < count % 3)


WORKLOADS = (Workload("small", 3, 6), Workload("shared", 5, 20))


def score(bed: LocalTestBed, placed: list[tuple[str, Address | None, bool]]) -> tuple[int, int]:
    def name(address: Address | None) -> str | None:  # a node by its plain or TLS stream port, whatever its host
        ports = (address.port,) if address is not None else ()
        return next((n.name for n in bed.nodes if n.stream_port in ports or n.stream_tls_port in ports), None)

    on_leader = on_replica = 0
    members = {stream: stream_members(bed, stream) for stream, _, _ in placed}
    for stream, node, is_producer in placed:
        leader, replicas = members[stream]
        if is_producer:
            on_leader += name(node) == name(leader)
        else:
            on_replica += name(node) in {name(r) for r in replicas}
    return on_leader, on_replica


def sessions(bed: LocalTestBed, mode: str) -> int:
    """Sessions so far: of the round-robin listener (``lb``, ``lb_tls``) or of the SNI frontend (``sni``)."""
    if mode == "sni":
        return bed.sni_sessions("stream")["frontend"]
    return bed.haproxy.sessions(LISTENER if mode == "lb" else "stream_tls_roundrobin")


def environment(bed: LocalTestBed, mode: str) -> Environment:
    """smartclient through the round-robin LB (``lb``), the same over TLS (``lb_tls``), or the SNI ingress."""
    if mode == "lb":
        host, port = bed.lb("stream")
        return Environment(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port)))
    tls_uri = bed.stream_uri("{}", 1).replace("rabbitmq-stream://", "rabbitmq-stream+tls://").replace("{}:1", "{}")
    if mode == "lb_tls":  # the nodes' certificates name 127.0.0.1 too
        host, port = bed.lb("stream_tls")
        return Environment(tls_uri.format(f"{host}:{port}"), resolver=LoadBalancer(Address(host, port)),
                           tls=bed.tls_context())
    entry = f"{bed.nodes[0].short}.smartclient.test:{bed.nodes[0].stream_tls_port}"  # routed by its name too
    return Environment(tls_uri.format(entry), resolver=SniRouter(Address(*bed.sni("stream"))), tls=bed.tls_context())


async def run_smartclient(bed: LocalTestBed, streams: list[str], work: Workload, mode: str = "lb") -> Result:
    before = sessions(bed, mode)
    started = time.monotonic()
    async with environment(bed, mode) as env:
        placed: list[tuple[str, Address | None, bool]] = []
        for i in range(work.producers):
            producer = await env.producer(streams[i % 3])
            placed.append((producer.stream, producer.node, True))
        for i in range(work.consumers):
            consumer = await env.consumer(streams[i % 3], lambda m, c: None)
            placed.append((consumer.stream, consumer.node, False))
        seconds = time.monotonic() - started
        opened = sessions(bed, mode) - before
        records = env.placements()
        connections = len({r.connection for r in records})
        minimum = len({(r.role, r.node) for r in records}) + 1
        wrong = sum(env.streams.connector.mismatches.values())
    return Result(opened, connections, minimum, seconds, *score(bed, placed), wrong=wrong)


async def run_rstream(bed: LocalTestBed, streams: list[str], work: Workload) -> Result:
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    host, port = bed.lb("stream")
    kwargs: dict[str, Any] = dict(username=bed.username, password=bed.password, load_balancer_mode=True)
    before = bed.haproxy.sessions(LISTENER)
    started = time.monotonic()
    producers = [Producer(host, port, **kwargs) for _ in range(work.per_stream(work.producers, 0))]
    consumers = [Consumer(host, port, **kwargs) for _ in range(work.per_stream(work.consumers, 0))]
    placed: list[tuple[str, Address | None, bool]] = []

    def node(client: Any) -> Address:
        props = client.server_properties
        return Address(props["advertised_host"], int(props["advertised_port"]))

    try:
        for index, stream in enumerate(streams):
            for producer in producers[:work.per_stream(work.producers, index)]:
                await producer._get_or_create_publisher(stream)  # what its first send() does
                placed.append((stream, node(producer._clients[stream]), True))
            for consumer in consumers[:work.per_stream(work.consumers, index)]:
                await consumer.subscribe(stream, lambda m, c: None,
                                         offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT))
                placed.append((stream, node(consumer._clients[stream]), False))
        seconds = time.monotonic() - started
        sessions = bed.haproxy.sessions(LISTENER) - before
        used: set[int] = set()
        for carrier in (*producers, *consumers):
            used |= {id(c) for c in carrier._clients.values()}
    finally:
        for carrier in (*producers, *consumers):
            await carrier.close()
    return Result(sessions, len(used), len(used) + 1, seconds, *score(bed, placed))


def show(name: str, work: Workload, r: Result) -> None:
    wrong = f"  wrong landings {r.wrong}" if r.wrong is not None else ""
    print(f"  {name:<12} sessions {r.sessions:>3}  connections {r.connections:>3}  minimum {r.minimum:>2}  "
          f"ratio {r.ratio:4.2f}  ready in {r.seconds:5.2f}s  producers on leader {r.producers_on_leader}/"
          f"{work.producers}  consumers on replicas {r.consumers_on_replica}/{work.consumers}{wrong}")


async def run_sni(bed: LocalTestBed, streams: list[str], work: Workload) -> tuple[Result, Result]:
    """The SNI workload and, in the same round, the round-robin LB over TLS: with the nodes advertising their
    names (the SNI rule's input for streams), restored after."""
    bed.advertise_hostnames(True)
    try:
        sni = await run_smartclient(bed, streams, work, "sni")
        await asyncio.sleep(0.5)
        lb_tls = await run_smartclient(bed, streams, work, "lb_tls")
    finally:
        bed.advertise_hostnames(False)
    return sni, lb_tls


async def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    worst: dict[str, float] = {}
    totals: dict[tuple[str, str], list[Result]] = {}
    for round_no in range(1, ROUNDS + 1):
        for work in WORKLOADS:
            streams = [f"bench-lb-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
            for i, stream in enumerate(streams):
                await create_stream_led_by(bed, stream, i)
            try:
                print(f"round {round_no}, workload {work.name} ({work.producers} producers, "
                      f"{work.consumers} consumers):")
                ours = await run_smartclient(bed, streams, work)
                await asyncio.sleep(0.5)
                theirs = await run_rstream(bed, streams, work)
                await asyncio.sleep(0.5)
                sni, lb_tls = await run_sni(bed, streams, work)
                show("smartclient", work, ours)
                show("rstream", work, theirs)
                show("sni", work, sni)
                show("rr lb tls", work, lb_tls)
                totals.setdefault((work.name, "smartclient"), []).append(ours)
                totals.setdefault((work.name, "rstream"), []).append(theirs)
                totals.setdefault((work.name, "sni"), []).append(sni)
                totals.setdefault((work.name, "rr lb tls"), []).append(lb_tls)
                worst[work.name] = max(worst.get(work.name, 0.0), ours.ratio)
            finally:
                await delete_streams(bed, *streams)
    for (work_name, name), results in totals.items():
        n = len(results)
        print(f"mean {work_name:<7} {name:<12} sessions {sum(r.sessions for r in results) / n:5.1f}  connections "
              f"{sum(r.connections for r in results) / n:5.1f}  ratio {sum(r.ratio for r in results) / n:4.2f}  "
              f"ready in {sum(r.seconds for r in results) / n:5.2f}s")
    sni_runs = [r for (_, name), results in totals.items() if name == "sni" for r in results]
    tls_runs = [r for (_, name), results in totals.items() if name == "rr lb tls" for r in results]
    placed_right = all(r.producers_on_leader + r.consumers_on_replica == work.producers + work.consumers
                       for work in WORKLOADS for r in totals[(work.name, "sni")])
    sni_ready, tls_ready = (sum(r.seconds for r in runs) / len(runs) for runs in (sni_runs, tls_runs))
    print(f"sni: sessions/minimum worst {max(r.ratio for r in sni_runs):.2f} (expected 1.00), wrong landings "
          f"{sum(r.wrong or 0 for r in sni_runs)} (expected 0), every placement right: {placed_right}; ready in "
          f"{sni_ready:.2f}s mean against {tls_ready:.2f}s through the round-robin LB over TLS (its sessions/minimum "
          f"worst {max(r.ratio for r in tls_runs):.2f}, wrong landings {sum(r.wrong or 0 for r in tls_runs)})")
    ratio = max(worst.values())
    verdict = "PASS" if ratio <= TARGET else "MISS"
    print("worst ratio per workload: " + ", ".join(f"{k} {v:.2f}" for k, v in worst.items()))
    print(f"lb_placement: session_ratio={ratio:.2f} target <= {TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
