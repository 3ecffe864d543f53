"""A fleet of service processes that lose a node at once: ``bench/scale.py --fleet`` and its short version in CI.

Each process (``python -m smartclient.testing.fleet``) opens its own Environment through the bed's round-robin load
balancer, with a producer and a single active consumer (one group for the whole fleet) on each partition of one
super stream.  Once every process is ready, :func:`fleet_round` kills one node (``kill -9`` by PID) and tells the
processes when; each reports when each of its handles was back (``Environment.on_recovery``), the connections it
dialled and the placements it made meanwhile, and its Metadata requests as they grew.  The node is started again
and the super stream deleted at the end, whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from smartclient.core.address import Address
from smartclient.core.retry import RetryPolicy
from smartclient.testing.processes import cpu_by_process
from smartclient.testing.testbed import TestBed

__all__ = ["FleetRound", "fleet_round", "percentile", "pooled"]

GROUP = "fleet"
SETTLED = 5.0  # seconds with no handle recovering, after the last recovery, that end a process's watch
WATCH = 120.0  # seconds a process watches at most after the kill


@dataclass(frozen=True)
class FleetRound:
    """What one round reported: the handles back and when (seconds after the kill, sorted), those that were not,
    the dials and placements the processes made after the kill, and the Metadata requests in the peak second."""

    processes: int
    jitter: float
    handles: int
    back: tuple[float, ...]
    failed: int
    dials: int
    placements: int
    metadata_peak: int
    #: the dials by what each connection was for (its name's stem: placement, ready for a member read, ...)
    dials_by: tuple[tuple[str, int], ...] = ()
    #: each handle back's own time (sorted): seconds after its partition had a leader on a live node again
    own: tuple[float, ...] = ()
    #: the slowest election of a partition's leader, seconds after the kill (0: the victim led none)
    election: float = 0.0
    #: CPU seconds spent in the second after the kill, by whom (the fleet, beam, haproxy, all), from /proc
    cpu: tuple[tuple[str, float], ...] = ()

    @property
    def p50(self) -> float:
        return percentile(self.back, 50)

    @property
    def p99(self) -> float:
        return percentile(self.back, 99)

    @property
    def own_p99(self) -> float:
        return percentile(self.own, 99)

    @property
    def worst(self) -> float:
        return self.back[-1] if self.back else math.nan

    def per_handle(self, count: int) -> float:
        """``count`` over the handles that came back."""
        return count / max(1, len(self.back))

    def line(self) -> str:
        return (f"{self.processes:>3} process(es), jitter {self.jitter:g}: {len(self.back)} handles back of "
                f"{self.handles} ({self.failed} not): p50 {self.p50:.2f} s, p99 {self.p99:.2f} s, worst "
                f"{self.worst:.2f} s after the kill; {self.per_handle(self.dials):.2f} dials and "
                f"{self.per_handle(self.placements):.2f} placements per handle back; Metadata requests in the peak "
                f"second {self.metadata_peak}; the slowest election {self.election:.2f} s, own p99 {self.own_p99:.2f} s"
                + (f"; dials for {', '.join(f'{what} {n}' for what, n in self.dials_by)}" if self.dials_by else "")
                + (f"; CPU-s in the second after the kill: {', '.join(f'{who} {t:.2f}' for who, t in self.cpu)}"
                   if self.cpu else ""))


def pooled(rounds: list[FleetRound]) -> FleetRound:
    """Rounds of one size and jitter as one: their handles back pooled (a p99 over several rounds, not the worst
    of one round's few), their counts summed, the highest of their peak seconds, their CPU seconds averaged."""
    return FleetRound(rounds[0].processes, rounds[0].jitter, sum(r.handles for r in rounds),
                      tuple(sorted(b for r in rounds for b in r.back)), sum(r.failed for r in rounds),
                      sum(r.dials for r in rounds), sum(r.placements for r in rounds),
                      max(r.metadata_peak for r in rounds), _by_count(Counter(dict(r.dials_by)) for r in rounds),
                      tuple(sorted(o for r in rounds for o in r.own)), max(r.election for r in rounds),
                      _mean_cpu([r.cpu for r in rounds]))


def _mean_cpu(cpus: list[tuple[tuple[str, float], ...]]) -> tuple[tuple[str, float], ...]:
    """The rounds' CPU seconds by whom, averaged over the rounds that measured them."""
    measured = [dict(c) for c in cpus if c]
    whom = list(dict.fromkeys(who for c in measured for who in c))  # (in the order they were first said)
    return tuple((who, sum(c[who] for c in measured if who in c) / sum(who in c for c in measured)) for who in whom)


def _by_count(counts: Iterable[Counter[str]]) -> tuple[tuple[str, int], ...]:
    """Counters summed, as (what, count) pairs, the most first."""
    total: Counter[str] = sum(counts, Counter())
    return tuple(total.most_common())


def percentile(values: tuple[float, ...] | list[float], pct: float) -> float:
    """The nearest-rank percentile of sorted ``values`` (nan when there are none)."""
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(pct / 100 * len(values)) - 1))]


def fleet_round(bed: TestBed, processes: int, victim: str, *, partitions: int = 10,
                jitter: float = 0.0) -> FleetRound:
    """``processes`` service processes on a new super stream of ``partitions``, ``victim`` killed once all are
    ready: what they report.  The node is started again before it returns."""
    from smartclient.environment import Environment

    name = f"fleet-{uuid.uuid4().hex[:8]}"
    entry = [bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]

    async def create() -> list[str]:
        async with Environment(entry) as env:
            return await env.create_super_stream(name, partitions=partitions)

    async def delete() -> None:
        async with Environment(entry) as env:
            await env.delete_super_stream(name, missing_ok=True)

    streams = asyncio.run(create())
    work = Path(f"/tmp/smartclient-{name}")
    work.mkdir()
    go = work / "go"
    elections = _Elections(bed, victim, streams)
    children: list[subprocess.Popen[str]] = []
    try:
        children += [subprocess.Popen([sys.executable, "-m", "smartclient.testing.fleet", "--super", name, "--jitter",
                                       str(jitter), "--go", str(go), "--ready", str(work / f"ready-{i}")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for i in range(processes)]
        deadline = time.monotonic() + 60 + 10 * processes
        while sum((work / f"ready-{i}").exists() for i in range(processes)) < processes:
            gone = [c for c in children if c.poll() is not None]
            if gone or time.monotonic() > deadline:
                why = "; ".join((c.stderr.read() if c.stderr else "")[-800:] for c in gone) or "not ready in time"
                raise RuntimeError(f"the fleet did not start: {why}")
            time.sleep(0.2)
        elections.ready()
        load = _Load(1.0)
        killed = time.time()
        bed.kill_node(victim)
        (work / "go.new").write_text(repr(killed))
        (work / "go.new").rename(go)  # (whole: a process that sees it reads the time, never an empty file)
        elections.begin(killed)
        reports = []
        for child in children:
            out, err = child.communicate(timeout=WATCH + 60)
            if child.returncode != 0:
                raise RuntimeError(f"a fleet process failed ({child.returncode}): {err[-2000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]) | {"log": err[-20000:]})
    finally:
        elected = elections.end()
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        shutil.rmtree(work, ignore_errors=True)
        bed.restart_node(victim)
        bed.heal()  # (the LB routes to it again before the next round: a round began once with it still DOWN there)
        asyncio.run(delete())
    if dump := os.environ.get("SMARTCLIENT_FLEET_DUMP"):  # every process's report, for a closer look: a directory,
        Path(dump).mkdir(parents=True, exist_ok=True)  # a file a round, named by its processes and super stream
        (Path(dump) / f"{processes}-{name}.json").write_text(json.dumps({"killed": killed, "elected": elected,
                                                                         "reports": reports}))
    per_second: Counter[int] = Counter()
    for report in reports:
        for (_, before), (at, after) in itertools.pairwise(report["metadata"]):
            per_second[int(at - killed)] += after - before
    backs = [b for r in reports for b in r["back"] if b["recovered"]]
    return FleetRound(
        processes, jitter, sum(r["handles"] for r in reports), tuple(sorted(b["at"] - killed for b in backs)),
        sum(1 for r in reports for b in r["back"] if not b["recovered"]) + sum(r["recovering"] for r in reports),
        sum(r["dialled"] for r in reports), sum(r["placements"] for r in reports),
        max(per_second.values(), default=0), _by_count(Counter(r["dials_by"]) for r in reports),
        tuple(sorted(max(0.0, b["at"] - killed - elected.get(b["stream"], 0.0)) for b in backs)),
        max(elected.values(), default=0.0), load.spent())


class _Load:
    """The CPU seconds spent in the ``seconds`` after it was made, by whom: the fleet's processes, the brokers
    (beam), HAProxy, and the whole machine (``all``: what its cores could give is cores x seconds).  Linux's
    /proc, read in a thread of its own; nothing where there is none."""

    WHO: ClassVar[Mapping[str, str]] = {"fleet": "smartclient.testing.fleet", "beam": "beam.smp", "haproxy": "haproxy"}

    def __init__(self, seconds: float) -> None:
        self._spent: dict[str, float] = {}
        self._thread = threading.Thread(target=self._measure, args=(seconds,), name="load", daemon=True)
        self._thread.start()

    def spent(self) -> tuple[tuple[str, float], ...]:
        self._thread.join(5)
        return tuple(self._spent.items())

    def _measure(self, seconds: float) -> None:
        try:
            before = self._read()
            time.sleep(seconds)
            after = self._read()
        except OSError:
            return
        for key, (who, spent) in after.items():  # (a process there both times: the killed node is not)
            if key in before:
                self._spent[who] = self._spent.get(who, 0.0) + spent - before[key][1]

    @classmethod
    def _read(cls) -> dict[int | str, tuple[str, float]]:
        """pid (or "all") -> (whose, CPU seconds so far)."""
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        # user, nice, system, irq, softirq (not idle, iowait, steal, nor guest: counted in user and nice already)
        spent: dict[int | str, tuple[str, float]] = {pid: cpu for pid, cpu in cpu_by_process(cls.WHO).items()}
        spent["all"] = ("all", sum(fields[i] for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK"))
        return spent


class _Elections:
    """Each partition's leader read from the remaining nodes after the kill (the Metadata command, no cache), in a
    thread of its own: when it was on a live node again, in seconds after the kill (0 if the killed node did not
    lead it: read before the kill)."""

    def __init__(self, bed: TestBed, victim: str, streams: list[str]) -> None:
        self._entry = [bed.stream_uri(n.host, n.stream_port) for n in bed.nodes if n.name != victim]
        self._victim = bed.node(victim).advertised
        self._partitions = streams
        self._connected, self._go, self._stop = threading.Event(), threading.Event(), threading.Event()
        self._killed = 0.0
        self._elected: dict[str, float] = {}
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()), name="elections", daemon=True)
        self._thread.start()

    def ready(self) -> None:
        """Once connected (a connection opened after the kill would count in the elections' times)."""
        if not self._connected.wait(30):
            raise RuntimeError("the elections' watch did not connect to the remaining nodes")

    def begin(self, killed: float) -> None:
        self._killed = killed
        self._go.set()

    def end(self) -> dict[str, float]:
        """The times read so far; a partition whose leader was not read back is not in them."""
        self._stop.set()
        self._go.set()
        self._thread.join(10)
        return dict(self._elected)

    async def _watch(self) -> None:
        from smartclient import ConnectionOptions, SmartClientError
        from smartclient.environment import Environment

        if not logging.getLogger("rstream").level:  # (a leader not yet elected is what this watch waits for: rstream
            logging.getLogger("rstream").setLevel(logging.ERROR)  # warns of it on every ask, unless told otherwise)

        async with Environment(self._entry, connection=ConnectionOptions(topology_max_age=0.001)) as env:
            before = await asyncio.gather(*(env.topology(s) for s in self._partitions))
            for topology in before:  # (led elsewhere: no election; the first read after the kill may be slow)
                if (topology.leader.host, topology.leader.port) != self._victim:
                    self._elected[topology.stream] = 0.0
            self._connected.set()
            while not self._go.is_set():
                await asyncio.sleep(0.01)

            async def one(stream: str) -> None:
                while not self._stop.is_set() and time.time() < self._killed + WATCH:
                    try:
                        topology = await asyncio.wait_for(env.topology(stream), 1.0)
                    except (SmartClientError, asyncio.TimeoutError):  # (no leader yet: it asks again)
                        topology = None
                    if topology is not None and (topology.leader.host, topology.leader.port) != self._victim:
                        self._elected[stream] = max(0.0, time.time() - self._killed)
                        return
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(one(s) for s in self._partitions if s not in self._elected))


async def _service(bed: TestBed, super_stream: str, jitter: float, go: Path, ready: Path) -> dict[str, Any]:
    """One service process: its handles, then, once ``go`` holds the kill's time, when each is back."""
    from resolvers import LoadBalancer
    from smartclient.environment import Environment

    host, port = bed.lb("stream")
    back: list[dict[str, Any]] = []
    placed: list[float] = []
    metadata: list[tuple[float, int]] = []
    env = Environment(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port)),
                      retry=RetryPolicy(backoff_jitter=jitter))
    env.on_recovery(lambda e: back.append({"at": time.time(), "cpu": time.process_time(), "recovered": e.recovered,
                                           "seconds": e.seconds,
                                           "stream": str(getattr(e.handle, "stream", "")),
                                           "attempts": e.attempts, "role": str(getattr(e.handle, "role", "")),
                                           "before": str(e.before), "after": str(e.after)}))
    async with env:
        producer = await env.super_stream_producer(super_stream, key=str)
        consumer = await env.super_stream_consumer(super_stream, lambda m, c: None, name=GROUP, single_active=True)
        handles = [*producer.producers.values(), *consumer.consumers.values()]
        placement, connector, topologies = env.streams._placement, env.streams.connector, env.streams._topologies
        told = placement.on_placed

        def on_placed(role: Any, seconds: float, sessions: int) -> None:
            placed.append(seconds)
            if told is not None:
                told(role, seconds, sessions)

        placement.on_placed = on_placed
        dial_log: list[tuple[float, float, str, str, str]] = []  # (began, ended, name, dialled, node or error)
        dials_by: Counter[str] = Counter()  # after the kill, by what the connection was for (its name's stem)
        dial_once = connector._dial_once

        async def counted(target: Any, name: str, *args: Any) -> Any:
            if not go.exists():
                return await dial_once(target, name, *args)
            dials_by[name.rstrip("0123456789-").removeprefix("smartclient").strip("-") or "placement"] += 1
            began = time.time()
            try:
                conn = await dial_once(target, name, *args)
            except BaseException as exc:
                dial_log.append((began, time.time(), name, str(target), type(exc).__name__))
                raise
            dial_log.append((began, time.time(), name, str(target), str(conn.node)))
            return conn

        connector._dial_once = counted  # type: ignore[method-assign,assignment]
        ready.write_text("ready")
        while not go.exists():
            await asyncio.sleep(0.05)
        killed = float(go.read_text())
        cpu = time.process_time()
        profiler = _profiler(ready)
        opened, placements = connector.opened, len(placed)
        recovering = len(handles)
        while time.time() < killed + WATCH:
            metadata.append((time.time(), topologies.metadata_requests))
            recovering = sum(1 for h in handles if h.recovering)
            if profiler is not None and back and not recovering:
                _dump(profiler)
                profiler = None
            if not recovering and time.time() - max([killed, *(b["at"] for b in back)]) > SETTLED:
                break
            await asyncio.sleep(0.1)
        dialled = connector.opened - opened
    return {"handles": len(handles), "back": back, "recovering": recovering, "dialled": dialled,
            "placements": len(placed) - placements, "metadata": metadata, "dials_by": dials_by,
            "dial_log": dial_log, "cpu": max([cpu, *(b["cpu"] for b in back)]) - cpu}


def _profiler(ready: Path) -> Any:
    """With ``SMARTCLIENT_FLEET_PROFILE`` (a directory): the first process's CPU profile of its recovery, from the
    kill until every handle is back (the others run unprofiled: a profiled fleet recovers at another pace)."""
    if not (where := os.environ.get("SMARTCLIENT_FLEET_PROFILE")) or not ready.name.endswith("-0"):
        return None
    import cProfile

    profiler = cProfile.Profile(time.process_time)
    profiler.smartclient_where = where  # type: ignore[attr-defined]
    profiler.enable()
    return profiler


def _dump(profiler: Any) -> None:
    profiler.disable()
    Path(profiler.smartclient_where).mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(Path(profiler.smartclient_where) / f"{os.getpid()}.prof")


def main() -> int:
    parser = argparse.ArgumentParser(description="one service process of a fleet (smartclient.testing.fleet)")
    parser.add_argument("--super", required=True)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--go", required=True, type=Path)
    parser.add_argument("--ready", required=True, type=Path)
    args = parser.parse_args()
    if level := os.environ.get("SMARTCLIENT_FLEET_LOG"):  # each process's log, in the dump
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    from smartclient.testing import from_env

    report = asyncio.run(_service(from_env(), args.super, args.jitter, args.go, args.ready))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
