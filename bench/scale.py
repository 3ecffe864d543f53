"""bench/scale.py: hundreds of partitions in one process, and a fleet of processes that lose a node at once.

**One process** (the default): super streams of 100 and 500 partitions (``--partitions``), each with a producer and
two single active consumers per partition (one group, ``scale``), opened by smartclient and, in a process of its own
beside it, by rstream's ``SuperStreamProducer`` and two ``SuperStreamConsumer``s, both dialling the three nodes
directly.  Each client's process reports:

* the time until every handle is ready;
* its connections per node and role, against the minimum: for each node and role (a single active consumer's lane
  is its own), its handles divided by the per-connection cap (200, ``PoolLimits.max_streams_per_connection``),
  rounded up, plus one locator;
* the Metadata requests it sent (smartclient's count; rstream's is not counted);
* its RSS per handle (the RSS it gained opening them, over the handles);
* publish and consume throughput summed over the partitions (the same bodies, ``--messages`` per partition, routed
  by the same murmur3 hash);
* each partition's consumer lag (sent less consumed, sampled every 20 ms until all is consumed, its mean): the
  highest against the median, and every message consumed.

Targets (for the largest super stream): connections at most 1.0x the minimum, at most 2 Metadata requests per
stream, no partition's lag above 3x the median (or above 200 messages, when the median is near 0: a partition that
keeps up is not behind), every message consumed once; and RSS per handle at most rstream's in the same run, at the
largest size rstream holds (its SuperStreamProducer refuses more than 200 partitions: MaxPublishersPerInstance).
Both clients first open and close a producer and a consumer, so that what is loaded once is not counted per handle.

**A fleet** (``--fleet N``, ``smartclient.testing.fleet``): N service processes (20 by default), each with its own
Environment through the bed's round-robin load balancer, a producer and a single active consumer on each of 10
partitions.  Once every handle is ready, one node is killed (``kill -9`` by PID), and each process reports when
each of its handles was back (``Environment.on_recovery``), the connections it dialled and the placements it made,
and its Metadata requests by the second.  Before the fleet, one process alone goes through the same kill: its own
recovery p99 is the anchor.  Both run with ``RetryPolicy.backoff_jitter`` off and on (``--jitter``).  Targets:
every handle back, the fleet's p99 within 2x the single process's, at most 1.5 dials per recovered handle.

The p99s are compared on each handle's **own** time: after its partition had a leader on a live node again (the
round reads each partition's Metadata from the remaining nodes meanwhile), not after the kill.  Both are printed.
An election is the broker's, alike for one process and for twenty, and RabbitMQ 4.0 to 4.3 stall one for 5 s
(a ``timer:sleep`` in the stream coordinator, on a race it meets in about one round of three or four): counted
from the kill, a ratio said whether a stall fell in the fleet's rounds or in the anchor's (1.08x, 4.06x, 7.78x).

Run from the repository root (it brings the loopback bed up if it is not): python bench/scale.py [--fleet 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smartclient import Environment  # noqa: E402
from smartclient.core.routing import hash_partition  # noqa: E402
from smartclient.core.settings import PoolLimits  # noqa: E402
from smartclient.testing.fleet import FleetRound, fleet_round, pooled  # noqa: E402
from smartclient.testing.local import LocalTestBed  # noqa: E402

CAP = PoolLimits().max_streams_per_connection
GROUP = "scale"
BODY = 100  # bytes per message
LAG_FACTOR, LAG_FLOOR = 3.0, 200
FLEET_PARTITIONS = 10
ALONE_ROUNDS = 2  # rounds of one process alone before each fleet round: the anchor
JITTER = 0.5  # RetryPolicy.backoff_jitter when it is on


def rss() -> int:
    """This process's resident set now, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def keys_for(partitions: list[str]) -> list[str]:
    """A routing key per partition, in order, that the murmur3 hash routes there (as both clients route)."""
    found: dict[str, str] = {}
    for i in range(100 * len(partitions)):
        key = f"k{i}"
        found.setdefault(hash_partition(key, partitions), key)
        if len(found) == len(partitions):
            break
    return [found[p] for p in partitions]


def body_of(key: str, index: int) -> bytes:
    return f"{key}|{index}|".encode().ljust(BODY, b"x")


def key_of(body: Any) -> str:
    return bytes(body).split(b"|", 1)[0].decode()


# -- one process: a super stream's handles ------------------------------------------------------------------------
async def smartclient_child(bed: LocalTestBed, super_stream: str, messages: int) -> dict[str, Any]:
    consumed: Counter[str] = Counter()
    async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]) as warm:  # (what is
        await warm.producer(f"{super_stream}-0")  # loaded once, modules and buffers, is not per handle: both
        await warm.consumer(f"{super_stream}-0", lambda m, c: None, offset="first")  # clients warm up alike)
    traced = bool(os.environ.get("SCALE_TRACEMALLOC"))  # where the memory goes, on stderr (it slows the child)
    if traced:
        import tracemalloc
        tracemalloc.start(int(os.environ["SCALE_TRACEMALLOC"]))
        before = tracemalloc.take_snapshot()
    rss0, began = rss(), time.monotonic()
    from smartclient.core.settings import ConnectionOptions
    connection = ConnectionOptions(dead_after=float(os.environ["SCALE_DEAD_AFTER"])) \
        if os.environ.get("SCALE_DEAD_AFTER") else ConnectionOptions()
    env = Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes], connection=connection)
    recoveries: list[Any] = []
    env.on_recovery(recoveries.append)
    async with env:
        producer = await env.super_stream_producer(super_stream, key=key_of)
        consumers = [await env.super_stream_consumer(super_stream, lambda m, c: consumed.update((c.stream,)),
                                                     offset="first", name=GROUP, single_active=True)
                     for _ in range(2)]
        ready = time.monotonic() - began
        # the broker then moves half the partitions to the group's second member (each asked to step down first):
        # traffic waits until every partition has one active member, or what the first read is read again
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
                sum(bool(c.consumers[p].active) for c in consumers) != 1 for p in producer.producers):
            await asyncio.sleep(0.05)
        settled = time.monotonic() - began
        handles = len(producer.producers) + sum(len(c.consumers) for c in consumers)
        gained = rss() - rss0
        if traced:
            _print_memory(tracemalloc.take_snapshot().compare_to(before, "traceback"), handles)
        records = env.placements()
        lanes = Counter((str(r.node), r.role.value) for r in records)
        connections = len({r.connection for r in records})
        per_lane = {f"{node} {role}": len({r.connection for r in records if (str(r.node), r.role.value) ==
                                           (node, role)}) for node, role in lanes}
        minimum = sum(math.ceil(n / CAP) for n in lanes.values())
        partitions = list(producer.producers)
        published, got, lags, publish_s, consume_s = await _traffic(
            partitions, messages, consumed, lambda bodies, key: producer.send_many(bodies, key=key), producer.flush)
        metadata = env.streams._topologies.metadata_requests
    return {"client": "smartclient", "handles": handles, "ready_s": ready, "settled_s": settled,
            "recoveries": len(recoveries), "connections": connections + 1,
            "minimum": minimum + 1, "per_lane": per_lane, "metadata": metadata, "rss_per_handle": gained / handles,
            "published": published, "consumed": got, "publish_s": publish_s, "consume_s": consume_s, "lags": lags}


def _print_memory(diff: list[Any], handles: int) -> None:
    """The allocations that grew, by the smartclient or rstream line that made them (its innermost frame in
    either), and by file, each in bytes per handle."""
    lines: Counter[str] = Counter()
    files: Counter[str] = Counter()
    for stat in diff:
        frames = [f for f in stat.traceback if "/smartclient/" in f.filename or "/rstream/" in f.filename]
        where = frames[-1] if frames else stat.traceback[-1]  # (a traceback runs from the oldest frame)
        name = where.filename.rsplit("site-packages/", 1)[-1].rsplit("/work/", 1)[-1]
        lines[f"{name}:{where.lineno}"] += stat.size_diff
        files[stat.traceback[-1].filename.rsplit("/", 2)[-1]] += stat.size_diff
    print(f"tracemalloc: {sum(lines.values()) / handles:,.0f} B per handle", file=sys.stderr)
    for title, counts in (("by line", lines), ("by file allocated in", files)):
        print(f"  {title}:", file=sys.stderr)
        for where, size in counts.most_common(40):
            print(f"    {size / handles:8,.0f} B  {where}", file=sys.stderr)


async def _traffic(partitions: list[str], messages: int, consumed: Counter[str], send: Any, flush: Any) -> tuple[
        int, int, dict[str, float], float, float]:
    """``messages`` to each partition, 100 at a time round the partitions.  Every 20 ms, each partition's lag (sent
    to it less consumed from it) is sampled, until every message is consumed; a partition's lag is the mean of its
    samples (one instant favours whichever partition was sent to last).  Returns the messages, the lags, and the
    seconds until the last publish was confirmed and until the last was consumed."""
    keys = keys_for(partitions)
    sent: Counter[str] = Counter()
    samples: dict[str, list[int]] = {p: [] for p in partitions}
    total = messages * len(partitions)
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            for p in partitions:
                samples[p].append(sent[p] - consumed[p])
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    began = time.monotonic()
    for start in range(0, messages, 100):
        for key, partition in zip(keys, partitions, strict=True):
            bodies = [body_of(key, i) for i in range(start, min(messages, start + 100))]
            await send(bodies, key)
            sent[partition] += len(bodies)
    await flush()
    publish_s = time.monotonic() - began
    deadline = time.monotonic() + 300
    while sum(consumed[p] for p in partitions) < total and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    consume_s = time.monotonic() - began
    done.set()
    await sampler
    lags = {p: statistics.fmean(v) if v else 0.0 for p, v in samples.items()}
    return total, sum(consumed[p] for p in partitions), lags, publish_s, consume_s


async def rstream_child(bed: LocalTestBed, super_stream: str, messages: int) -> dict[str, Any]:
    from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType, SuperStreamConsumer
    from rstream import SuperStreamProducer as RProducer
    from rstream.schema import OffsetSpecification

    node = bed.nodes[0]
    kwargs: dict[str, Any] = dict(username=bed.username, password=bed.password, super_stream=super_stream)
    consumed: Counter[str] = Counter()

    async def on_message(message: Any, context: Any) -> None:
        consumed[context.stream] += 1

    async def activated(active: bool, context: Any) -> Any:
        return OffsetSpecification(OffsetType.FIRST, 0)

    async def routing_key(message: Any) -> str:
        return key_of(message.body)

    from rstream import Consumer as RConsumer
    from rstream import Producer as RPlain

    async with RPlain(node.host, node.stream_port, username=bed.username, password=bed.password) as warm:
        await warm._get_or_create_publisher(f"{super_stream}-0")
    warm_consumer = RConsumer(node.host, node.stream_port, username=bed.username, password=bed.password)
    await warm_consumer.start()
    await warm_consumer.subscribe(f"{super_stream}-0", on_message)
    await warm_consumer.close()
    rss0, began = rss(), time.monotonic()
    producer = RProducer(node.host, node.stream_port, routing_extractor=routing_key, **kwargs)
    consumers = [SuperStreamConsumer(node.host, node.stream_port, **kwargs) for _ in range(2)]
    try:
        await producer.start()
        partitions = await producer.super_stream_metadata.partitions()
        for part in partitions:  # what its first send to each does (rstream opens a publisher lazily)
            await producer._get_producer()
            await producer._producer._get_or_create_publisher(part)
        for consumer in consumers:
            await consumer.start()
            await consumer.subscribe(on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                                     properties={"single-active-consumer": "true", "name": GROUP,
                                                 "super-stream": super_stream},
                                     consumer_update_listener=activated)
        ready = time.monotonic() - began
        handles = len(partitions) * 3
        gained = rss() - rss0
        clients = {id(c) for c in producer._producer._clients.values()}
        for consumer in consumers:
            clients |= {id(c) for c in consumer._consumer._clients.values()}

        sent, confirmed = [0], [0]

        async def on_confirm(status: Any) -> None:
            confirmed[0] += 1

        async def send(bodies: list[bytes], key: str) -> None:
            for body in bodies:
                sent[0] += 1
                await producer.send(AMQPMessage(body=body), on_publish_confirm=on_confirm)

        async def flush() -> None:  # rstream has no flush: wait for every confirm
            deadline = time.monotonic() + 300
            while confirmed[0] < sent[0] and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        published, got, lags, publish_s, consume_s = await _traffic(partitions, messages, consumed, send, flush)
    finally:
        for carrier in (producer, *consumers):
            await carrier.close()
    return {"client": "rstream", "handles": handles, "ready_s": ready, "connections": len(clients) + 1,
            "minimum": None, "per_lane": {}, "metadata": None, "rss_per_handle": gained / handles,
            "published": published, "consumed": got, "publish_s": publish_s, "consume_s": consume_s, "lags": lags}


def lag_verdict(lags: dict[str, float]) -> tuple[float, float, bool]:
    values = list(lags.values())
    highest, median = max(values), statistics.median(values)
    return highest, median, highest <= max(LAG_FACTOR * median, LAG_FLOOR)


def run_child(*args: str, timeout: float = 900) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"bench/scale.py {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def one_process(bed: LocalTestBed, sizes: list[int], messages: int) -> bool:
    ok = True
    compared: tuple[int, float] | None = None  # (partitions, smartclient's RSS per handle over rstream's)
    for size in sizes:
        print(f"\n{size} partitions, a producer and 2 single active consumers each, {messages} messages of {BODY} B "
              f"per partition (each client on a super stream of its own)")
        results = []
        for client in ("smartclient", "rstream"):
            name = f"scale-{size}-{client}-{uuid.uuid4().hex[:6]}"
            try:
                async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]) as env:
                    began = time.monotonic()
                    await env.create_super_stream(name, partitions=size)
                    print(f"  {client:<12} {name} created in {time.monotonic() - began:.1f} s")
                results.append(run_child("--child", client, "--super", name, "--messages", str(messages)))
            except Exception as exc:  # (rstream may not hold what smartclient does: shown, not fatal)
                print(f"  {client}: {str(exc)[:200]} ... {str(exc)[-1200:]}")
            finally:
                async with Environment([bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]) as env:
                    await env.delete_super_stream(name, missing_ok=True)
        for r in results:
            highest, median, kept_up = lag_verdict(r["lags"])
            conns = f"{r['connections']} (minimum {r['minimum']}, {r['connections'] / r['minimum']:.2f}x)" \
                if r["minimum"] else f"{r['connections']}"
            metadata = f"{r['metadata']} ({r['metadata'] / size:.2f} per stream)" if r["metadata"] is not None \
                else "not counted"
            settled = f" (every partition with one active consumer in {r['settled_s']:.1f} s)" \
                if "settled_s" in r else ""
            print(f"  {r['client']:<12} {r['handles']} handles ready in {r['ready_s']:.1f} s{settled}; connections "
                  f"{conns}; Metadata requests {metadata}; RSS {r['rss_per_handle'] / 1024:.1f} KiB per handle")
            print(f"  {'':<12} publish {r['published'] / r['publish_s']:,.0f} msg/s, consume "
                  f"{r['published'] / r['consume_s']:,.0f} msg/s; mean lag: highest {highest:,.0f}, "
                  f"median {median:,.0f}{'' if kept_up else '  (a partition fell behind)'}; consumed "
                  f"{r['consumed']:,} of {r['published']:,}" + (
                      f"; {r['recoveries']} recoveries" if "recoveries" in r else ""))
            if r["per_lane"]:
                print(f"  {'':<12} connections by node and role: " + ", ".join(
                    f"{lane} {n}" for lane, n in sorted(r["per_lane"].items())))
        ours = next((r for r in results if r["client"] == "smartclient"), None)
        theirs = next((r for r in results if r["client"] == "rstream"), None)
        if ours is not None and theirs is not None:
            compared = (size, ours["rss_per_handle"] / theirs["rss_per_handle"])
            print(f"  RSS per handle, smartclient / rstream: {compared[1]:.2f}")
        if size == max(sizes):
            if ours is None:
                return False
            ok = all([ours["connections"] <= ours["minimum"], ours["metadata"] <= 2 * size,
                      lag_verdict(ours["lags"])[2], ours["consumed"] == ours["published"]])
    if compared is None:
        print("no size that rstream could hold: RSS not compared (MISS)")
        return False
    print(f"RSS per handle compared at {compared[0]} partitions (the largest rstream held): smartclient / rstream "
          f"{compared[1]:.2f}")
    return ok and compared[1] <= 1.0


# -- a fleet ------------------------------------------------------------------------------------------------------
def fleet(bed: LocalTestBed, processes: int, jitters: list[float], rounds: int) -> bool:
    """``rounds`` rounds of each jitter, taken in turn (the bed drifts: no jitter gets all the early or late ones),
    each with ``ALONE_ROUNDS`` rounds of one process as its anchor; figures pooled per jitter."""
    victim = bed.nodes[1].name
    print(f"a fleet of {processes} processes, each a producer and a single active consumer on each of "
          f"{FLEET_PARTITIONS} partitions through the round-robin LB; {victim} killed (kill -9) once all are ready; "
          f"{rounds} round(s) of each jitter, one process alone {ALONE_ROUNDS} times before each")
    alone: dict[float, list[FleetRound]] = {j: [] for j in jitters}
    many: dict[float, list[FleetRound]] = {j: [] for j in jitters}
    for _ in range(rounds):
        for jitter in jitters:
            for _ in range(ALONE_ROUNDS):
                alone[jitter].append(fleet_round(bed, 1, victim, partitions=FLEET_PARTITIONS, jitter=jitter))
                print(f"  {alone[jitter][-1].line()}")
            many[jitter].append(fleet_round(bed, processes, victim, partitions=FLEET_PARTITIONS, jitter=jitter))
            print(f"  {many[jitter][-1].line()}")
    ok = True
    for jitter in jitters:
        one, all_ = pooled(alone[jitter]), pooled(many[jitter])
        ratio = all_.p99 / one.p99 if one.p99 > 0 else math.inf
        own = all_.own_p99 / one.own_p99 if one.own_p99 > 0 else math.inf
        dials = all_.per_handle(all_.dials)
        peaks = sorted(r.metadata_peak for r in many[jitter])
        print(f"  jitter {jitter:g}, pooled: one process p99 {one.p99:.2f} s ({len(one.back)} handles back); the "
              f"fleet p50 {all_.p50:.2f} s, p99 {all_.p99:.2f} s, worst {all_.worst:.2f} s ({len(all_.back)} back, "
              f"{all_.failed} not); p99 / one process's = {ratio:.2f}; the slowest elections {one.election:.2f} s "
              f"(one process) and {all_.election:.2f} s (the fleet); own p99 (after the partition's election) "
              f"{one.own_p99:.2f} s and {all_.own_p99:.2f} s: {own:.2f}x (target <= 2); dials per handle back "
              f"{dials:.2f} (target <= 1.5); Metadata requests in the peak second {peaks}")
        if all_.cpu:
            spent = dict(all_.cpu)
            print(f"  jitter {jitter:g}: in the second after the kill the machine spent {spent.get('all', 0):.2f} "
                  f"CPU-s of the {os.cpu_count()} its cores give (the fleet {spent.get('fleet', 0):.2f}, the brokers "
                  f"{spent.get('beam', 0):.2f}, HAProxy {spent.get('haproxy', 0):.2f}); one process alone: "
                  + ", ".join(f"{who} {t:.2f}" for who, t in one.cpu))
        ok = ok and not all_.failed and bool(all_.back) and own <= 2.0 and dials <= 1.5
    return ok


# -- entry --------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", default="100,500", help="super stream sizes, comma-separated (100,500)")
    parser.add_argument("--messages", type=int, default=200, help="messages per partition (200)")
    parser.add_argument("--fleet", type=int, help="run the fleet of N processes instead")
    parser.add_argument("--jitter", default="0,0.5", help="backoff_jitter values for the fleet (0,0.5)")
    parser.add_argument("--rounds", type=int, default=2, help="fleet rounds of each jitter (2)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--super", help=argparse.SUPPRESS)
    args = parser.parse_args()
    bed = LocalTestBed.from_env()
    if args.child:
        if os.environ.get("SCALE_LOG"):  # (the child's log, to see what happened in it)
            import logging
            logging.basicConfig(level=os.environ["SCALE_LOG"], format="%(asctime)s %(name)s %(message)s")
        runner = smartclient_child if args.child == "smartclient" else rstream_child
        print(json.dumps(asyncio.run(runner(bed, args.super, args.messages))))
        return 0
    bed.up()
    if args.fleet:
        ok = fleet(bed, args.fleet, [float(j) for j in args.jitter.split(",")], args.rounds)
        verdict = "PASS" if ok else "MISS"
        print(f"scale_fleet: processes={args.fleet} target every handle back, own p99 <= 2x one process's, "
              f"dials <= 1.5 per handle {verdict}")
        return 0 if ok else 1
    sizes = [int(s) for s in args.partitions.split(",")]
    ok = asyncio.run(one_process(bed, sizes, args.messages))
    verdict = "PASS" if ok else "MISS"
    print(f"scale: partitions={max(sizes)} target connections <= 1.0x minimum, metadata <= 2 per stream, "
          f"RSS per handle <= rstream's, lag <= 3x median {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
