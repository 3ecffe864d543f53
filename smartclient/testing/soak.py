"""The soak: a month of a service's life compressed into minutes, with its resources accounted for.

    python -m smartclient.testing soak --minutes 45 [--seed S] [--history run.jsonl]

It runs the nemesis's whole workload through the load balancer (:mod:`smartclient.testing.nemesis`: named
producers, plain, tracked, single-active and super-stream consumers, an AMQP RPC loop and an MQTT fleet) at a
gentler rate, and adds what weeks bring:

* **rolling restarts** every ``rollout_every`` seconds: each node in turn waited on until it can go without
  costing a quorum, stopped, started and waited for (:meth:`~smartclient.testing.local.LocalTestBed.roll_node`,
  as the Kubernetes cluster operator does), ``stop_app``/``start_app`` and full process restarts in turn;
* **connection churn**: every ``churn_every`` seconds a producer and a consumer opened, used and closed, a
  super stream's consumer coming and going, and now and then a stream created, used and deleted;
* **locked clients**: an Environment on OAuth2 tokens of ``token_lifetime`` seconds (refreshed on its live
  connections), and one on a client certificate (SASL EXTERNAL) rotated every ``certificate_every`` seconds, whose
  churn opens new connections with the newest one;
* now and then a **leader move**, a management-API connection close or the LB's sessions cut (the nemesis's).

**Resource accounting**: every ``sample_every`` seconds, between two churn cycles once the connections the last
one parked have left (after their idle time, up to 8 s), the process's RSS, open file descriptors, asyncio tasks
and threads, every table of each Environment (:meth:`~smartclient.stream.wing.StreamWing.resources`) and the metric
attribute sets (data points) its instruments report are recorded as ``resources`` history records.
:func:`check_resources` (pure) then says whether each is flat: RSS grows by less than ``rss_growth`` from the
first rollout's settled window (every path has run once by then) to the end, and every count comes back to its
baseline (the first sample after the warm-up) after each rollout (some sample after it has settled is at or
below it; what follows the leaders, such as connections and their descriptors and tasks, may settle up to a few
per node higher, :data:`PER_NODE`, since the leaders move at each rollout).  A probe
(:mod:`smartclient.testing.probe`) records when each stream takes a write again after a node stops or a leader
moves, so the checker reports the clients' own share of each wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartclient._errors import ConfigurationError, SmartClientError
from smartclient.allocator import MemoryTrimmer
from smartclient.stream import unreported
from smartclient.testing.checker import Report, read_history
from smartclient.testing.footprint import metric_points, node_sockets, process_resources, rss_after_trim
from smartclient.testing.nemesis import History, Plan, Run, run
from smartclient.testing.probe import writable_back
from smartclient.testing.resource_check import ResourceReport, check_resources

__all__ = ["ResourceReport", "Rollout", "SoakPlan", "SoakReport", "check_resources", "rollouts", "soak"]

@dataclass(frozen=True)
class SoakPlan:
    minutes: float = 45.0
    seed: int = 1
    rollout_every: float = 600.0  # seconds between two rolling restarts
    first_rollout: float | None = None  # seconds until the first (default: half of rollout_every)
    churn_every: float = 3.0  # seconds between two churn cycles
    stream_every: int = 5  # every this many churn cycles, a stream is created, used and deleted
    token_lifetime: float = 60.0
    certificate_every: float = 300.0
    sample_every: float = 10.0
    warmup: float = 60.0  # seconds before the baseline sample
    settle: float = 20.0  # seconds after a rollout before its counts are judged
    rss_growth: float = 0.05
    rate: float = 40.0  # messages per second per producer (the nemesis's 200 would fill memory with history)
    faults: tuple[str, ...] = ("move_leader", "close_connection", "lb_sessions")
    fault_gap: tuple[float, float] = (30.0, 60.0)
    trace_memory: bool = False  # tracemalloc on (slower): where memory grew from the warm-up to the end
    quiet: float = 0.0  # seconds at the end with no random fault (a short run judges its resources there)
    amqp10: bool = False  # the nemesis's AMQP 1.0 publisher and consumer too (the [amqp10] extra)
    # what a long-lived service opts into (docs/reliability.md): the allocator's kept free memory handed back
    # every this many seconds (smartclient.allocator.return_free_memory); None: glibc keeps what it keeps
    trim_every: float | None = 60.0

    def __post_init__(self) -> None:
        for name in ("minutes", "rollout_every", "churn_every", "token_lifetime", "certificate_every",
                     "sample_every", "rate"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ConfigurationError(f"SoakPlan.{name} must be a positive number of seconds, not {value!r}")
        trim = self.trim_every
        if trim is not None and (isinstance(trim, bool) or not isinstance(trim, int | float)
                                 or not 0 < trim <= threading.TIMEOUT_MAX):
            raise ConfigurationError(f"SoakPlan.trim_every must be a positive number of seconds or None, "
                                     f"not {self.trim_every!r}")
        if self.first_rollout is not None and self.first_rollout < 0:
            raise ConfigurationError(f"SoakPlan.first_rollout must be 0 or more seconds, not {self.first_rollout!r}")
        if self.stream_every < 1:
            raise ConfigurationError(f"SoakPlan.stream_every must be 1 or more cycles, not {self.stream_every!r}")
        if not 0 < self.rss_growth < 1:
            raise ConfigurationError(f"SoakPlan.rss_growth must be a share between 0 and 1, not {self.rss_growth!r}")
        self.nemesis()  # the fault kinds are the nemesis's

    def nemesis(self) -> Plan:
        return Plan(minutes=self.minutes, seed=self.seed, gap=self.fault_gap, rate=self.rate, kinds=self.faults,
                    quiet=self.quiet, amqp10=self.amqp10)

    @property
    def rollout_times(self) -> list[float]:
        """When each rolling restart begins (seconds after the start): none later than 90 s before the end, so
        that each has ended and settled before the workload stops."""
        first = self.rollout_every / 2 if self.first_rollout is None else self.first_rollout
        times, at = [], first
        while at <= self.minutes * 60 - 90:
            times.append(at)
            at += self.rollout_every
        return times


# -- the resources ---------------------------------------------------------------------------------------
@dataclass
class Rollout:
    began: float
    ended: float
    progress: list[float]  # every client's wait after each node's stop
    own: list[float]  # the same, from when its streams took writes again
    rolled: int = 0  # nodes it stopped and started
    errors: list[str] = field(default_factory=list)  # nodes it could not roll, and why (the broker's check failed)

    @staticmethod
    def p99(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0


def rollouts(records: Iterable[Mapping[str, Any]], report: Report) -> list[Rollout]:
    """Each rolling restart of a history, with the progress after its node stops (from ``report.delays``)."""
    records = list(records)
    spans = [(float(r["began"]), float(r["t"])) for r in records if r.get("kind") == "rollout"]
    stops = sorted(float(r["t"]) for r in records if r.get("kind") == "fault" and r.get("what") == "roll")
    errors = [(float(r["t"]), str(r.get("error", ""))) for r in records
              if r.get("kind") == "fault_error" and r.get("what") == "roll"]
    out = []
    for began, ended in spans:
        mine = {t for t in stops if began <= t <= ended}
        out.append(Rollout(began, ended, [p - at for _, at, p, _ in report.delays if at in mine],
                           [own for _, at, _, own in report.delays if at in mine], len(mine),
                           [error for t, error in errors if began <= t <= ended]))
    return out


@dataclass
class SoakReport:
    plan: SoakPlan
    report: Report
    resources: ResourceReport
    rollouts: list[Rollout]
    ops: dict[str, int]
    memory: list[str] = field(default_factory=list)  # tracemalloc's top growth (trace_memory)
    #: the delivery watch's resubscriptions by kind: "rescue" (a consumer silent with committed messages beyond
    #: it) and "last chunk" (one chunk right at its position: an offset-tracking chunk, most often)
    watch: dict[str, int] = field(default_factory=dict)
    trim: tuple[int, int] = (0, 0)  # RSS (KiB) at the end, and after malloc_trim(0) (footprint.rss_after_trim)
    watches: list[str] = field(default_factory=list)  # each resubscription's facts (watch_evidence)

    @property
    def ok(self) -> bool:
        return self.report.ok and self.resources.flat(self.plan.rss_growth) and not self.rolls_failed

    @property
    def rolls_failed(self) -> int:
        """Node rolls that did not happen (a soak whose rollouts restarted nothing proves nothing about them)."""
        return sum(len(r.errors) for r in self.rollouts)

    def summary(self) -> str:
        lines = [self.report.summary(), "rolling restarts:"]
        for r in self.rollouts:
            lines.append(f"  at {r.began:7.1f} s, {r.ended - r.began:5.1f} s long, {r.rolled} node(s) rolled: progress "
                         f"after a node stop p99 {Rollout.p99(r.progress):.2f} s, worst "
                         f"{max(r.progress, default=0.0):.2f} s; the clients' own p99 {Rollout.p99(r.own):.2f} s")
            lines += [f"    NOT ROLLED: {error[:300]}" for error in r.errors]
        lines.append(f"delivery watch: {self.watch.get('rescue', 0)} rescue(s) (a consumer silent with committed "
                     f"messages beyond it), {self.watch.get('last chunk', 0)} look(s) at a last chunk (an "
                     f"offset-tracking chunk, most often)")
        lines += self.watches
        res = self.resources
        lines.append(f"resources: {res.samples} samples; RSS {res.rss_growth * 100:+.1f} % from the first rollout's "
                     f"settled sample ({res.rss_baseline} KiB; limit {self.plan.rss_growth * 100:.0f} %), "
                     f"{res.rss_growth_since_warmup * 100:+.1f} % from the warm-up's; "
                     + (f"its lows after each rollout (KiB): {', '.join(map(str, res.rss_lows))}; "
                        if res.rss_lows else "")
                     + (f"not back to the baseline: {sorted(res.not_back)}" if res.not_back else "every count back")
                     + (f"; not judged (no settled sample): {res.unjudged}" if res.unjudged else ""))
        lines.append(res.table())
        lines.append(f"RSS at the end {self.trim[0]} KiB, {self.trim[1]} KiB after malloc_trim(0): "
                     f"{self.trim[0] - self.trim[1]} KiB were free memory the allocator kept (not in use)")
        if self.memory:
            lines.append("memory grown from the warm-up to the end (tracemalloc, by line):")
            lines += [f"  {line}" for line in self.memory]
        return "\n".join(lines)


# -- the extras --------------------------------------------------------------------------------------------
@dataclass
class _Shared:
    plan: SoakPlan
    envs: dict[str, Any] = field(default_factory=dict)  # name -> an Environment whose tables are sampled
    quiet: asyncio.Lock = field(default_factory=asyncio.Lock)  # held by a churn cycle; the sampler takes it
    rolling: bool = False
    certificate: Any = None
    memory: Any = None  # tracemalloc's snapshot at the end of the warm-up (trace_memory)
    started: float = field(default_factory=time.monotonic)


def _rolling_restarts(shared: _Shared) -> Callable[[Run], Any]:
    async def roll(ctx: Run) -> None:
        plan, events = shared.plan, asyncio.get_running_loop()
        for k, at in enumerate(plan.rollout_times):
            if await _wait(ctx.stop, shared.started + at - time.monotonic()):
                return
            async with ctx.nodes:  # no other node fault meanwhile
                shared.rolling = True
                began = ctx.history.add("rollout_began", index=k)
                ctx.say(f"{began:7.1f} s  rolling restart {k + 1}")
                for i, node in enumerate(ctx.bed.nodes):
                    full = (i + k) % 2 == 1  # stop_app and full restarts in turn, flipped at each rollout
                    probes: list[asyncio.Future[None]] = []
                    healed = asyncio.Event()

                    def stopping(node: Any = node, full: bool = full, probes: list[Any] = probes,
                                 healed: asyncio.Event = healed) -> None:
                        """On the bed's thread, once the node may go: the fault is now, and so is the probe."""
                        fault_t = ctx.history.add("fault", what="roll", target=node.name, full=full)
                        probes.append(asyncio.run_coroutine_threadsafe(writable_back(
                            ctx.bed, ctx.streams, fault_t, ctx.history, victim=node.name, healed=healed), events))
                    try:
                        down = await asyncio.to_thread(ctx.bed.roll_node, node.name, full, stopping)
                    except Exception as exc:  # recorded; the bed is healed at the end
                        ctx.history.add("fault_error", what="roll", error=f"{type(exc).__name__}: {exc}")
                        down = -1.0
                    ctx.history.add("heal", what="roll", target=node.name, down=round(down, 2))
                    healed.set()
                    for probe in probes:
                        await asyncio.wrap_future(probe)
                ctx.history.add("rollout", index=k, began=began)
                shared.rolling = False
    return roll


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True if it was."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    return stop.is_set()


def _sampler(shared: _Shared, reader: Any) -> Callable[[Run], Any]:
    async def sample(ctx: Run) -> None:
        try:
            await _sample(ctx)
        finally:
            # the allocator's kept free memory, handed back after the last judged sample (it changes RSS)
            before, after = rss_after_trim()
            ctx.history.add("trim", before=before, after=after)
            if shared.plan.trace_memory and tracemalloc.is_tracing():
                growth = tracemalloc.take_snapshot().compare_to(shared.memory, "lineno") if shared.memory else []
                ctx.history.add("memory", top=[f"{s.size_diff / 1024:+.0f} KiB in {s.count_diff:+d} blocks: "
                                               f"{s.traceback}" for s in growth[:15]])
                tracemalloc.stop()

    async def _sample(ctx: Run) -> None:
        if shared.plan.trace_memory:
            tracemalloc.start()
        while not await _wait(ctx.stop, shared.plan.sample_every):
            if shared.plan.trace_memory and shared.memory is None and time.monotonic() - shared.started >= \
                    shared.plan.warmup:
                shared.memory = tracemalloc.take_snapshot()  # the baseline's: compared at the end
            async with shared.quiet:
                # the connections the last cycle parked leave after their idle time: sampled once they have
                with contextlib.suppress(TimeoutError):
                    await _until(lambda: all(not len(e.streams.connector.parking) for e in shared.envs.values()), 8, "")
                values = process_resources()
                for env in shared.envs.values():
                    for key, n in env.streams.resources().items():
                        values[key] = values.get(key, 0) + n
                if reader is not None:
                    values.update(await asyncio.to_thread(metric_points, reader))
                ctx.history.add("resources", rolling=shared.rolling, values=values)
    return sample


def _churn(shared: _Shared) -> Callable[[Run], Any]:
    """Every ``churn_every`` s, in turn: a named producer and a consumer on the churn stream opened, ten messages
    sent and read, both closed; a super stream's consumer opened until it is handed a message, closed; and every
    ``stream_every`` cycles a stream created, written, read and deleted.  The main Environment (through the LB)
    and the certificate one take turns.  Each cycle is an ``op`` (``churn``, ``churn-super``, ``churn-stream``)."""
    async def churn(ctx: Run) -> None:
        stream = f"nemesis-{ctx.run_id}-churn"
        await ctx.env.create_stream(stream, {"initial-cluster-size": 3})
        ctx.read_back.append(stream)
        next_id, cycle = 1, 0

        async def handles(env: Any) -> None:
            nonlocal next_id
            next_id += 10
            await churn_handles(env, stream, f"nemesis-{ctx.run_id}-churn", range(next_id - 10, next_id), ctx.history)

        async def super_consumer(env: Any) -> None:
            got = asyncio.Event()
            consumer = await env.super_stream_consumer(ctx.super_stream, lambda m, c: got.set(), offset="last")
            try:
                await asyncio.wait_for(got.wait(), 15)
            finally:
                await consumer.close()

        async def short_lived(env: Any) -> None:
            name = f"nemesis-{ctx.run_id}-tmp-{cycle}"
            await env.create_stream(name, {"initial-cluster-size": 3})
            try:  # each handle closed even when what follows its opening fails
                async with contextlib.AsyncExitStack() as opened:
                    producer = await env.producer(name)
                    opened.push_async_callback(producer.close)
                    await producer.send_wait(b"tmp:1")
                    got = asyncio.Event()
                    consumer = await env.consumer(name, lambda m, c: got.set(), offset="first")
                    opened.push_async_callback(consumer.close)
                    await asyncio.wait_for(got.wait(), 15)
            finally:  # a rolling restart may cut one try: a service tries again, or the broker keeps the stream
                await _until_done(lambda: env.delete_stream(name, missing_ok=True), 30, f"deleting {name}")

        while not await _wait(ctx.stop, shared.plan.churn_every):
            cycle += 1
            envs = [e for n, e in shared.envs.items() if n in ("main", "certificate")]
            env = envs[cycle % len(envs)]
            kind, action = (("churn-stream", short_lived) if cycle % shared.plan.stream_every == 0 else
                            ("churn-super", super_consumer) if cycle % 2 else ("churn", handles))
            async with shared.quiet:
                try:
                    await asyncio.wait_for(action(env), 60)
                except Exception as exc:  # counted by type, as the nemesis's RPC and MQTT errors
                    ctx.history.add("op", client=kind, ok=False, error=type(exc).__name__, untimed=True)
                else:
                    ctx.history.add("op", client=kind, ok=True, untimed=True)
    return churn


async def churn_handles(env: Any, stream: str, name: str, ids: range, history: History) -> None:
    """A consumer and a named producer opened on ``stream``, ``ids`` sent and read, both closed, each even when
    opening the other failed (the 2-hour soak of 2026-11-27 leaked a consumer at each of 4 failed producer opens)."""
    got: list[int] = []

    def confirmed(c: Any) -> None:  # a smartclient.Confirmation
        if c.confirmed:
            history.add("confirm", client="p-churn", id=c.publishing_id, untimed=True)
        else:
            history.add("fail", client="p-churn", id=c.publishing_id, reason=str(c.reason or ""),
                        code=c.code, untimed=True)
    async with contextlib.AsyncExitStack() as opened:
        consumer = await env.consumer(stream, lambda message, context: got.append(context.offset), offset="next")
        opened.push_async_callback(consumer.close)
        producer = await env.producer(stream, name=name)
        opened.push_async_callback(producer.close)
        for i in ids:
            await producer.send(f"p-churn:{i}".encode(), publishing_id=i, on_confirm=confirmed)
            history.add("send", client="p-churn", id=i, untimed=True)
        await producer.flush()
        await _until(lambda: len(got) >= len(ids), 15, f"the churn consumer's {len(ids)} messages")


async def _until_done(action: Callable[[], Awaitable[object]], timeout: float, what: str) -> None:
    """``action`` again every second while it fails, for up to ``timeout`` s (then its last failure is raised);
    ``what`` names it in a log line per failed try."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await action()
            return
        except SmartClientError as exc:
            if time.monotonic() > deadline:
                raise  # its own type: the op's error count names it
            logging.getLogger(__name__).info("%s failed (%s): trying again", what, exc)
        await asyncio.sleep(1)


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come within {timeout:g} s")
        await asyncio.sleep(0.05)


def _locked(shared: _Shared) -> Callable[[Run], Any]:
    """An Environment on short-lived OAuth2 tokens (through the LB) with a named producer and a tracked consumer
    on the first stream, and one on a client certificate rotated every ``certificate_every`` s (its handles are
    the churn's)."""
    async def locked(ctx: Run) -> None:
        from resolvers import LoadBalancer
        from smartclient import ClientCertificate, Environment, OffsetTracking, TokenCredentials
        from smartclient.core.settings import ConnectionOptions

        bed, plan = ctx.bed, shared.plan
        host, port = bed.lb("stream")
        tokens = TokenCredentials(bed.tokens.provider(f"soak-{ctx.run_id}", lifetime=plan.token_lifetime),
                                  name="the test bed's IdP")
        issued = await asyncio.to_thread(bed.client_certificate, f"soak-{ctx.run_id}")
        shared.certificate = ClientCertificate(issued.cert_file, issued.key_file)
        entries = [f"rabbitmq-stream+tls://{n.host}:{n.stream_tls_port}/" for n in bed.nodes]
        async with Environment(bed.stream_uri(host, port), resolver=LoadBalancer(f"{host}:{port}"), credentials=tokens,
                               connection=ConnectionOptions(name="nemesis-token")) as by_token, \
                Environment(entries, tls=bed.tls_context(), client_certificate=lambda: shared.certificate,
                            connection=ConnectionOptions(name="nemesis-certificate")) as by_certificate:
            shared.envs.update(token=by_token, certificate=by_certificate)
            stream = ctx.streams[0]

            def on_message(message: Any, context: Any) -> None:
                ctx.history.add("deliver", client="c-token", stream=stream, offset=context.offset)
            consumer = await by_token.consumer(stream, on_message, offset="first", name=f"nemesis-{ctx.run_id}-token",
                                               tracking=OffsetTracking(every=100, interval=1.0))
            rotations = asyncio.create_task(_rotate(ctx, shared, issued.common_name))
            try:
                await _produce(by_token, stream, "p-token", ctx, plan.rate / 2)
            finally:
                rotations.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await rotations
                await consumer.close()
                connector = by_token.streams.connector
                ctx.say(f"tokens: {tokens.provider_calls} provider calls, {tokens.refreshes} refreshes, "
                        f"{connector.secret_updates} secret updates, {connector.secret_failures} failed")
                shared.envs.pop("token", None)
                shared.envs.pop("certificate", None)
    return locked


async def _rotate(ctx: Run, shared: _Shared, common_name: str) -> None:
    from smartclient import ClientCertificate

    while not await _wait(ctx.stop, shared.plan.certificate_every):
        rotated = await asyncio.to_thread(ctx.bed.rotate_client_certificate, common_name)
        shared.certificate = ClientCertificate(rotated.cert_file, rotated.key_file)
        ctx.history.add("rotation", what="client certificate", target=common_name)


async def _produce(env: Any, stream: str, client: str, ctx: Run, rate: float) -> None:
    """A named producer sending ``client:id`` with explicit ids until ``ctx.stop``, recorded as the nemesis's."""
    from smartclient import Confirmation, EnqueueTimeout

    producer = await env.producer(stream, name=f"nemesis-{ctx.run_id}-{client}")

    def confirmed(c: Confirmation) -> None:
        if c.confirmed:
            ctx.history.add("confirm", client=client, id=c.publishing_id)
        else:
            ctx.history.add("fail", client=client, id=c.publishing_id, reason=str(c.reason or ""), code=c.code)
    next_id = 1
    while not ctx.stop.is_set():
        try:
            await producer.send(f"{client}:{next_id}".encode(), publishing_id=next_id, on_confirm=confirmed)
        except EnqueueTimeout as exc:
            ctx.history.add("refused", client=client, id=next_id, reason=str(exc))
        else:
            ctx.history.add("send", client=client, id=next_id)
        next_id += 1
        await asyncio.sleep(1.0 / rate)
    await asyncio.wait_for(producer.flush(), 60)
    await producer.close()


# -- the run ------------------------------------------------------------------------------------------------
async def soak(bed: Any, plan: SoakPlan, history_path: str | Path,
               progress: Callable[[str], None] | None = None) -> SoakReport:
    """Run the soak against ``bed``; the history goes to ``history_path`` only (not kept in memory, whose growth
    is measured), and is checked from there at the end."""
    from smartclient.core.settings import Telemetry

    say = progress or (lambda text: None)
    shared = _Shared(plan)
    reader, telemetry = None, None
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        say("soak: no OpenTelemetry SDK (pip install 'smartclient[otel]'): metric attribute sets are not sampled")
    else:
        from opentelemetry.sdk.metrics import Counter, Histogram, UpDownCounter
        from opentelemetry.sdk.metrics.export import AggregationTemporality

        # delta for the synchronous instruments: with cumulative temporality the SDK keeps a series for every
        # attribute set ever recorded (every stream ever used), whatever the library does (docs/observability.md)
        delta = AggregationTemporality.DELTA
        reader = InMemoryMetricReader(preferred_temporality={Counter: delta, Histogram: delta, UpDownCounter: delta})
        telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    history = History(history_path, keep=False)

    async def main_env(ctx: Run) -> None:  # the nemesis's Environment is sampled too
        shared.envs["main"] = ctx.env
        shared.started = time.monotonic()
        await ctx.stop.wait()

    say(f"soak: {plan.minutes:g} min, seed {plan.seed}, rolling restarts at "
        f"{', '.join(f'{t:.0f}' for t in plan.rollout_times)} s, faults {', '.join(plan.faults)}")
    watcher = logging.getLogger(unreported.__name__)
    watch, level = _WatchCount(watcher.getEffectiveLevel(), _record_watch(bed, history)), watcher.level
    watcher.addFilter(watch)
    watcher.setLevel(min(watch.floor, logging.INFO))  # its quiet (INFO) resubscriptions are counted too
    trimmer = None if plan.trim_every is None else MemoryTrimmer(plan.trim_every)
    try:
        report = await run(bed, plan.nemesis(), progress=say, history=history, telemetry=telemetry,
                           extras=(main_env, _rolling_restarts(shared), _churn(shared), _locked(shared),
                                   _sampler(shared, reader)))
    finally:
        watcher.removeFilter(watch)
        watcher.setLevel(level)
        if trimmer is not None:
            trimmer.close()
    records = read_history(history_path)
    trim = next(((int(r["before"]), int(r["after"])) for r in records if r.get("kind") == "trim"), (0, 0))
    resources, ops = check_resources(records, plan.warmup, plan.settle, len(bed.nodes)), dict(report.ops_ok)
    return SoakReport(plan, report, resources, rollouts(records, report), ops,
                      next((list(r["top"]) for r in records if r.get("kind") == "memory"), []), dict(watch.kinds), trim,
                      watch_evidence(records))


class _WatchCount(logging.Filter):
    """On the delivery watch's logger: counts its resubscriptions by kind, hands each one's facts to
    ``on_fire`` (before the consumer subscribes again: the soak records the broker's view then), and lets
    through only what the logger's own level (``floor``) did before."""

    def __init__(self, floor: int, on_fire: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        super().__init__()
        self.floor = floor
        self.kinds: Counter[str] = Counter()
        self.on_fire = on_fire

    def filter(self, record: logging.LogRecord) -> bool:
        if (kind := getattr(record, unreported.WATCH_RECORD, None)) is not None:
            self.kinds[kind] += 1
            if self.on_fire is not None:
                try:
                    self.on_fire(kind, dict(getattr(record, unreported.WATCH_FACTS, None) or {}))
                except Exception as exc:  # the watch's own work must go on (logging lets a filter's error out)
                    self.kinds["not recorded"] += 1
                    logging.getLogger(__name__).debug("a delivery-watch record was not written: %s", exc)
        return record.levelno >= self.floor


def _record_watch(bed: Any, history: History) -> Callable[[str, dict[str, Any]], None]:
    """A ``watch`` history record per resubscription by the delivery watch, with the broker's view of the
    stream's consumers (their credits, offsets and lag, from the management API: one GET of at most a second,
    made on the event loop so that the client has not moved yet; the broker's statistics are those of its last
    refresh, every 5 s by default)."""
    def on_fire(kind: str, facts: dict[str, Any]) -> None:
        try:
            with bed.management(timeout=1.0) as api:
                listed = api.get("/api/stream/consumers/%2F")
            consumers = [{k: c.get(k) for k in ("subscription_id", "credits", "offset", "offset_lag", "consumed",
                                                "active")} | {"node": _of(c, "connection_details", "node")}
                         for c in listed if _of(c, "queue", "name") == facts.get("stream")]
        except Exception as exc:  # a node down, a slow answer: the record says so
            consumers = [{"error": f"{type(exc).__name__}: {exc}"[:200]}]
        history.add("watch", watch=kind, **facts, broker=consumers, sockets=node_sockets(str(facts.get("node", ""))))
    return on_fire


def _of(entry: Any, key: str, inner: str) -> Any:
    """``entry[key][inner]``, or None (the management API may give a string where a dict was expected)."""
    value = entry.get(key) if isinstance(entry, dict) else None
    return value.get(inner) if isinstance(value, dict) else None


def watch_evidence(records: Iterable[Mapping[str, Any]], shown: int = 12) -> list[str]:
    """What each resubscription by the delivery watch was for (pure, at most ``shown`` lines and a count of the
    rest): whether a data message (read back at the end, or the run's end marker) sits between the offset the
    consumer waited for and the committed chunk it read, so it was silent on something it should have had, or
    none does (offset-tracking chunks, never delivered to a consumer), or the stream was not read back (the
    churn's short-lived streams), so nobody knows."""
    stored: dict[str, set[int]] = {}
    read_back: set[str] = set()
    watches: list[Mapping[str, Any]] = []
    for r in records:
        if r.get("kind") in ("stored", "marker"):
            stored.setdefault(r["stream"], set()).add(int(r["offset"]))
            if r["kind"] == "marker":
                read_back.add(r["stream"])
        elif r.get("kind") == "watch":
            watches.append(r)
    lines = []
    for w in watches[:shown]:
        low, high, stream = w.get("waiting_for"), w.get("committed"), w.get("stream", "")
        if stream not in read_back or low is None or high is None:
            what = "not known (the stream was not read back)"
        elif any(offset in stored[stream] for offset in range(low, high + 1)):
            what = "a data message there (a silence)"
        else:
            what = "no data message there (offset-tracking chunks)"
        lines.append(f"  at {w['t']:8.1f} s, {w.get('watch')}: {stream} on {w.get('node')}, silent {w.get('silent')} s "
                     f"waiting for offset {low}, committed chunk {high}: {what}; the broker's consumers: "
                     f"{w.get('broker')}; sockets with bytes unread (Recv-Q Send-Q local peer): "
                     f"{[q for q in w.get('sockets', []) if not q.startswith('0 0 ')]}")
    if len(watches) > shown:
        lines.append(f"  and {len(watches) - shown} more (the history's watch records)")
    return lines
