"""The nemesis: a stream workload placed through the round-robin load balancer while a seeded random schedule
injects the test bed's faults, more than one at a time; the history then goes to :mod:`.checker`.

    python -m smartclient.testing nemesis --minutes 3 --seed 7 [--history run.jsonl]

The schedule (pure, :func:`schedule`) keeps a quorum: at most one node is down (``kill -9`` or ``stop_app``)
at any time, since RabbitMQ 4.3's metadata store (Khepri) and every stream need a majority to progress.
Other faults overlap freely: leader moves, management-API connection closes, an LB backend disabled, LB
sessions cut, an LB restart and the DNS server down.  On the namespaced bed, partitions (:data:`PARTITIONS`) take
a node away too, silently: from its peers, from everyone, or from the load balancer (both ways or one).

The workload, every connection placed through the LB:

* named producers on several streams with ``send()`` and a confirm callback, and one with ``send_many()``
  (whose batch is confirmed by a ``flush()``);
* consumers: a plain and a tracked one, a single-active pair, and a super-stream consumer;
* a named super-stream producer (routed by key, one publishing id sequence over the partitions);
* an AMQP RPC loop (servers on every node, a client through the LB) and a small MQTT fleet publishing
  QoS 1, each in a thread, each call recorded as an ``op`` with its outcome (errors counted by type).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from smartclient._errors import ConfigurationError
from smartclient.core.settings import ConnectionOptions
from smartclient.testing.checker import Report, check
from smartclient.testing.probe import queues_writable, writable_back
from smartclient.testing.thread_loads import (
    amqp10_loop,
    amqp_quorum_loop,
    mqtt_loop,
    mqtt_qos1_loop,
    quorum_queues,
    rpc_loop,
)

__all__ = ["FAULTS", "LOOPBACK_FAULTS", "PARTITIONS", "Anchor", "Extra", "Fault", "History", "Plan", "Run", "run",
           "schedule"]

log = logging.getLogger(__name__)

Anchor = Callable[[Any, str, "History", asyncio.Event, float], Coroutine[Any, Any, None]]

#: the partitions (issue 55), only on the namespaced bed: fault -> (the bed's partition, its direction); each a
#: silent drop at one node, which it takes away from its peers, from everyone, or from the load balancer
PARTITIONS: dict[str, tuple[str, str]] = {
    "isolate-from-peers": ("isolate-from-peers", "both"), "isolate": ("isolate", "both"), "split": ("split", "both"),
    "cut-lb": ("cut-lb", "both"), "cut-lb-one-way": ("cut-lb", "in"),
}
#: fault -> whether it takes a node away (only one of those at a time: the quorum stays)
FAULTS: dict[str, bool] = {
    "kill": True, "stop_app": True, "move_leader": False, "close_connection": False, "lb_backend": False,
    "lb_sessions": False, "lb_restart": False, "dns": False, **dict.fromkeys(PARTITIONS, True),
}
#: the faults any bed can make (a plan's default)
LOOPBACK_FAULTS = tuple(k for k in FAULTS if k not in PARTITIONS)


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start
    what: str
    target: str  # a node name, a stream, or "" for the whole LB / DNS server
    hold: float  # seconds until it is healed (0: nothing to heal)


@dataclass(frozen=True)
class Plan:
    minutes: float = 3.0
    seed: int = 1
    streams: int = 3
    gap: tuple[float, float] = (3.0, 8.0)  # seconds between two faults
    hold: tuple[float, float] = (2.0, 6.0)  # seconds a fault lasts
    rate: float = 200.0  # messages per second per producer
    kinds: tuple[str, ...] = LOOPBACK_FAULTS  # the faults to draw from (all but the partitions by default)
    quiet: float = 0.0  # seconds at the end with no fault (the soak judges its resources there)
    #: an AMQP 1.0 publisher and consumer too (issue 34): bench/nemesis.py runs them; the soak does not yet (the
    #: 40-minute run of 2026-11-26 with them grew malloc in use by 78 MiB and leaked 26 descriptors)
    amqp10: bool = False
    #: AMQP 0.9.1 and MQTT QoS 1 on quorum queues too, checked at least once (bench/partitions.py runs them)
    queues: bool = False
    heartbeat: int = 60  # the Environment's ConnectionOptions.heartbeat (AMQP 0.9.1 and 1.0 keep it as given)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(FAULTS))
        if unknown or not self.kinds:
            raise ConfigurationError(f"nemesis fault kinds must be some of {', '.join(FAULTS)}, not "
                                     f"{', '.join(unknown) or 'none'}")


def schedule(plan: Plan, nodes: list[str], streams: list[str]) -> list[Fault]:
    """The faults of a run, from its seed alone: the same plan gives the same schedule."""
    rng = random.Random(plan.seed)
    faults: list[Fault] = []
    at = rng.uniform(*plan.gap)
    end = plan.minutes * 60 - max(plan.hold) - plan.quiet  # the last fault is healed before the workload stops
    node_down_until = 0.0
    while at < end:
        kinds = [k for k in plan.kinds if not (FAULTS[k] and at < node_down_until)]
        if not kinds:  # only node faults, and a node is still away
            at += rng.uniform(*plan.gap)
            continue
        what = rng.choice(kinds)
        held = what in ("kill", "stop_app", "lb_backend", "dns") or what in PARTITIONS
        hold = rng.uniform(*plan.hold) if held else 0.0
        target = rng.choice(streams) if what == "move_leader" else (
            rng.choice(nodes) if what in ("kill", "stop_app", "lb_backend", "lb_sessions", *PARTITIONS) else "")
        if FAULTS[what]:
            node_down_until = at + hold + 5.0  # and a few seconds to rejoin
        faults.append(Fault(round(at, 3), what, target, round(hold, 3)))
        at += rng.uniform(*plan.gap)
    return faults


class History:
    """Every event of a run, in memory and (optionally) as JSON lines."""

    def __init__(self, path: str | Path | None = None, keep: bool = True) -> None:
        self._lock = threading.Lock()  # the RPC and MQTT loops add from their threads
        self.path = Path(path) if path else None
        self.keep = keep  # in memory too (a long soak keeps them in the file only: its memory is measured)
        self.records: list[dict[str, Any]] = []
        self.start = time.monotonic()
        self._file: IO[str] | None = Path(path).open("w") if path else None  # noqa: SIM115  (closed by close())

    def add(self, kind: str, **fields: Any) -> float:
        """Record an event now; return its ``t``."""
        with self._lock:
            t = round(time.monotonic() - self.start, 4)
            record = {"kind": kind, "t": t, **fields}
            if self.keep:
                self.records.append(record)
            if self._file is not None:
                self._file.write(json.dumps(record) + "\n")
            return t

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def _leaders_back(bed: Any, streams: list[str], victim: str, fault_t: float, history: History) -> None:
    """After a node fault: ask another node's Metadata every 50 ms until every stream has a leader that is not
    on ``victim``, and record when (the broker's part of the wait; up to 60 s)."""
    from smartclient.testing.streams import raw_stream_client

    gone = next(n for n in bed.nodes if n.name == victim)
    survivor = next(n for n in bed.nodes if n.name != victim)
    pending = set(streams)
    back: dict[str, float] = {}  # stream -> when its leader was named (the history's clock)
    deadline = time.monotonic() + 60
    try:
        async with raw_stream_client(bed, survivor.host, survivor.stream_port, name="nemesis-probe") as client:
            while pending and time.monotonic() < deadline:
                for stream in sorted(pending):
                    try:
                        leader, _ = await asyncio.wait_for(client.query_leader_and_replicas(stream), 2)
                    except Exception:  # no leader yet (or a slow answer): ask again
                        continue
                    if (leader.host, leader.port) != gone.advertised:
                        pending.discard(stream)
                        back[stream] = round(time.monotonic() - history.start, 4)
                if pending:
                    await asyncio.sleep(0.05)
    except Exception as exc:  # the probe's node went down too: the checker then has no figure for this fault
        history.add("fault_error", what="leaders probe", error=f"{type(exc).__name__}: {exc}")
        return
    history.add("leaders", fault_t=fault_t, target=victim, missing=len(pending), streams=back)


async def _inject(bed: Any, fault: Fault, history: History, streams: list[str] | None = None,
                  nodes: asyncio.Lock | None = None, queues: list[str] | None = None) -> None:
    """Apply ``fault``, hold it, heal it (each test-bed call off the event loop); after a node fault, record
    when the broker has a leader for each of ``streams`` again, and when each can take a write again (after a
    leader move, the moved stream; after a partition, ``queues`` too).  A node fault holds ``nodes`` (one node
    away at a time) until healed."""
    # a leader move holds back member starts and stops of every stream on the other nodes for a moment (the test
    # bed suspends their osiris supervisors): one at a time with node faults and rollouts, or it stalls them
    if (FAULTS[fault.what] or fault.what == "move_leader") and nodes is not None:
        async with nodes:
            await _inject(bed, fault, history, streams, queues=queues)
        return
    call: Callable[..., Any]
    heal: Callable[[], Any] | None = None
    if fault.what == "kill":
        call, heal = (lambda: bed.kill_node(fault.target)), (lambda: bed.restart_node(fault.target))
    elif fault.what == "stop_app":
        call, heal = (lambda: bed.stop_app(fault.target)), (lambda: bed.start_app(fault.target))
    elif fault.what == "move_leader":
        call = lambda: bed.move_leader(fault.target, str(random.Random(fault.at).choice(  # noqa: E731
            [n.name for n in bed.nodes])))
    elif fault.what == "close_connection":
        call = lambda: _close_one_connection(bed, fault.at)  # noqa: E731
    elif fault.what == "lb_backend":
        call, heal = (lambda: bed.disable_lb_backend(fault.target)), (lambda: bed.enable_lb_backend(fault.target))
    elif fault.what == "lb_sessions":
        call = lambda: bed.shutdown_lb_sessions(fault.target)  # noqa: E731
    elif fault.what == "lb_restart":
        call = bed.restart_lb
    elif fault.what in PARTITIONS:
        kind, direction = PARTITIONS[fault.what]
        call = lambda: bed.partition(kind, fault.target, direction=direction)  # noqa: E731
        heal = bed.heal_partitions
    else:
        call, heal = bed.stop_dns, bed.start_dns
    silent = {"silent": True} if fault.what in PARTITIONS else {}  # (the checker times its clients' share apart)
    probe: asyncio.Future[Any] | None = None
    healed = asyncio.Event()
    at: list[float] = []

    def inject() -> None:  # timed on its thread, as it begins: a busy executor may have held the call back
        at.append(history.add("fault", what=fault.what, target=fault.target, **silent))
        call()

    try:
        await asyncio.to_thread(inject)
    except Exception as exc:  # a fault that could not be injected is recorded, not fatal
        history.add("fault_error", what=fault.what, error=f"{type(exc).__name__}: {exc}")
    else:
        fault_t = at[0]
        if streams and fault.what in ("kill", "stop_app"):
            probe = asyncio.gather(_leaders_back(bed, streams, fault.target, fault_t, history),
                                   writable_back(bed, streams, fault_t, history, victim=fault.target, healed=healed))
        elif streams and fault.what in PARTITIONS:  # (the leaders may stay: the cut node's peers may not know yet)
            probe = asyncio.gather(writable_back(bed, streams, fault_t, history, victim=fault.target, healed=healed),
                                   queues_writable(bed, queues or [], fault_t, history, victim=fault.target,
                                                   healed=healed))
        elif streams and fault.what == "move_leader":
            probe = asyncio.ensure_future(writable_back(bed, [fault.target], fault_t, history))
        elif streams and fault.what == "lb_restart":  # back once the LB routes again: what follows is the clients'
            back = history.add("writable_lb", fault_t=fault_t)
            history.add("writable", fault_t=fault_t, target="lb", streams=dict.fromkeys(streams, back), missing=0)
    if heal is not None:
        await asyncio.sleep(fault.hold)
        began = round(time.monotonic() - history.start, 4)  # (the heal takes effect during the call)
        try:
            await asyncio.to_thread(heal)
        except Exception as exc:
            history.add("fault_error", what=f"heal {fault.what}", error=f"{type(exc).__name__}: {exc}")
        history.add("heal", what=fault.what, target=fault.target, began=began)
    healed.set()
    if probe is not None:
        await probe


def _close_one_connection(bed: Any, seed: float) -> None:
    with bed.management() as api:
        ours = [c["name"] for c in api.connections()
                if str((c.get("client_properties") or {}).get("connection_name", "")).startswith("nemesis-")]
    if ours:
        bed.close_connection(random.Random(seed).choice(ours))


@dataclass
class Run:
    """What a run's extra workloads (``extras`` of :func:`run`) are handed: they run from the start until
    ``stop`` is set (``halt`` for threads), record into ``history``, and hold ``nodes`` while a node is away."""

    bed: Any
    env: Any
    history: History
    stop: asyncio.Event
    halt: threading.Event
    run_id: str
    streams: list[str]  # the workload's streams and the super stream's partitions, probed after node faults
    super_stream: str
    nodes: asyncio.Lock
    say: Callable[[str], None]
    read_back: list[str]  # more streams to read back at the end (an extra adds its own)


Extra = Callable[[Run], Coroutine[Any, Any, None]]


async def run(bed: Any, plan: Plan, history_path: str | Path | None = None,
              progress: Callable[[str], None] | None = None, anchor: Anchor | None = None,
              extras: tuple[Extra, ...] = (), telemetry: Any = None, history: History | None = None) -> Report:
    """Run the workload and the schedule against ``bed`` for ``plan.minutes``; return the checker's report.
    ``anchor(bed, stream, history, stop, rate)``: another client to run under the same faults, on a stream of its
    own, recording as a client named ``anchor-...`` (``bench/nemesis.py`` runs raw rstream so).  ``extras``: more
    workloads, each given the :class:`Run` (the soak's churn, rolling restarts and accounting); ``telemetry``:
    the Environment's (a :class:`~smartclient.core.settings.Telemetry`); ``history``: where to record (else a new
    one, written to ``history_path``)."""
    from resolvers import LoadBalancer
    from smartclient import Confirmation, EnqueueTimeout, Environment, OffsetTracking

    say = progress or (lambda text: None)
    history = history if history is not None else History(history_path)
    host, port = bed.lb("stream")
    uri = bed.stream_uri(host, port)
    lb = LoadBalancer(f"{host}:{port}", amqp=bed.lb("amqp")[1], mqtt=bed.lb("mqtt")[1])
    run_id = f"{plan.seed}-{int(time.time())}"
    streams = [f"nemesis-{run_id}-{i}" for i in range(plan.streams)]
    super_stream = f"nemesis-{run_id}-super"
    faults = schedule(plan, [n.name for n in bed.nodes], streams)
    stop = asyncio.Event()
    halt = threading.Event()  # the same, for the RPC and MQTT threads
    try:
        async with Environment(uri, resolver=lb, connection=ConnectionOptions(name="nemesis", heartbeat=plan.heartbeat),
                               management=bed.management(), **({"telemetry": telemetry} if telemetry else {})) as env:
            for stream in streams:
                await env.create_stream(stream, {"initial-cluster-size": 3})
            partitions = await env.create_super_stream(super_stream, partitions=3)
            anchor_stream = f"nemesis-{run_id}-anchor"
            if anchor is not None:
                await env.create_stream(anchor_stream, {"initial-cluster-size": 3})

            def deliver(client: str, stream: str) -> Callable[[Any, Any], None]:
                def on_message(message: Any, context: Any) -> None:
                    history.add("deliver", client=client, stream=stream, offset=context.offset)
                return on_message

            await env.consumer(streams[0], deliver("c-plain", streams[0]), offset="first")
            await env.consumer(streams[0], deliver("c-tracked", streams[0]), offset="first", name="nemesis-tracked",
                               tracking=OffsetTracking(every=100, interval=1.0))
            if len(streams) > 1:
                for _ in range(2):  # a single-active pair: one group, one gap-free sequence of offsets
                    await env.consumer(streams[1], deliver("c-sac", streams[1]), offset="first", name="nemesis-sac",
                                       single_active=True, tracking=OffsetTracking(every=100, interval=1.0))

            async def produce(index: int, stream: str) -> None:
                client = f"p{index}"
                producer = await env.producer(stream, name=f"nemesis-{client}")

                def confirmed(confirmation: Confirmation) -> None:
                    if confirmation.confirmed:
                        history.add("confirm", client=client, id=confirmation.publishing_id)
                    else:
                        history.add("fail", client=client, id=confirmation.publishing_id,
                                    reason=str(confirmation.reason or ""), code=confirmation.code)

                next_id, interval = 1, 1.0 / plan.rate
                while not stop.is_set():
                    try:
                        await producer.send(f"{client}:{next_id}".encode(), publishing_id=next_id,
                                            on_confirm=confirmed)
                    except EnqueueTimeout as exc:  # not queued: never sent, so it must not be stored
                        history.add("refused", client=client, id=next_id, reason=str(exc))
                    else:
                        history.add("send", client=client, id=next_id)
                    next_id += 1
                    await asyncio.sleep(interval)
                await asyncio.wait_for(producer.flush(), 60)

            producers = [asyncio.create_task(produce(i, s)) for i, s in enumerate(streams)]
            producers.append(asyncio.create_task(_send_many(env, streams[-1], history, stop, plan.rate)))
            producers.append(asyncio.create_task(_super_stream(env, super_stream, history, stop, plan.rate)))
            if anchor is not None:
                producers.append(asyncio.create_task(anchor(bed, anchor_stream, history, stop, plan.rate)))
            threads = [threading.Thread(target=loop, args=(env, history, halt, run_id), name=loop.__name__, daemon=True)
                       for loop in (rpc_loop, mqtt_loop, *((amqp10_loop,) if plan.amqp10 else ()),
                                    *((amqp_quorum_loop, mqtt_qos1_loop) if plan.queues else ()))]
            for thread in threads:
                thread.start()
            nodes = asyncio.Lock()
            queues = quorum_queues(run_id, plan.amqp10, plan.queues)
            for queue, users in queues.items():  # (the checker times their share from their queue's probe)
                for user in users:
                    history.add("uses", client=user, stream=queue)
            context = Run(bed, env, history, stop, halt, run_id, [*streams, *partitions], super_stream, nodes, say, [])
            others = [asyncio.create_task(extra(context)) for extra in extras]
            started = time.monotonic()
            injections = []
            for fault in faults:
                await asyncio.sleep(max(0.0, started + fault.at - time.monotonic()))
                say(f"{fault.at:7.1f} s  {fault.what} {fault.target}".rstrip())
                injections.append(asyncio.create_task(_inject(bed, fault, history, [*streams, *partitions], nodes,
                                                                  list(queues))))
            await asyncio.gather(*injections)
            await asyncio.sleep(max(0.0, started + plan.minutes * 60 - time.monotonic()))
            stop.set()
            halt.set()
            await asyncio.gather(*producers, *others)
            for thread in threads:
                await asyncio.to_thread(thread.join, 60)
            await asyncio.to_thread(bed.heal)
            await _read_back(env, [*streams, *partitions, *([anchor_stream] if anchor is not None else []),
                                   *context.read_back], history)
            for stream in [*streams, *([anchor_stream] if anchor is not None else []), *context.read_back]:
                await env.delete_stream(stream, missing_ok=True)
            await env.delete_super_stream(super_stream, missing_ok=True)
    finally:
        stop.set()
        halt.set()
        history.close()
    if not history.keep and history.path is not None:
        from smartclient.testing.checker import read_history

        return check(read_history(history.path))
    return check(history.records)


async def _read_back(env: Any, streams: list[str], history: History) -> None:
    """Every message stored in each stream, from the first offset up to an end marker appended now."""
    for stream in streams:
        marker = (await env.producer(stream))
        await marker.send_wait(b"end")
        done = asyncio.Event()

        def on_message(message: Any, context: Any, stream: str = stream, done: asyncio.Event = done) -> None:
            body = bytes(message)  # the anchor's AMQP 1.0 messages too: one data section, handed over as the body
            if body == b"end":  # (its offset: a data message, for the soak's delivery-watch evidence)
                history.add("marker", stream=stream, offset=context.offset)
                done.set()
                return
            client, _, ident = body.decode().partition(":")
            history.add("stored", client=client, stream=stream, offset=context.offset, id=int(ident))

        consumer = await env.consumer(stream, on_message, offset="first")
        await asyncio.wait_for(done.wait(), 120)
        await consumer.close()
        await marker.close()


def _fail(history: History, client: str, ids: range | list[int], reason: str, code: int) -> None:
    for i in ids:
        history.add("fail", client=client, id=i, reason=reason, code=code)


async def _send_many(env: Any, stream: str, history: History, stop: asyncio.Event, rate: float) -> None:
    """A named producer publishing lists with ``send_many()``: a batch is confirmed by the ``flush()`` after it
    when no message failed meanwhile (the producer's failure count says so), else failed as a whole (some of
    it may be stored: the checker counts those apart)."""
    from smartclient import EnqueueTimeout

    client, size = "p-many", 20
    producer = await env.producer(stream, name=f"nemesis-{client}")
    next_id = 1
    while not stop.is_set():
        ids = range(next_id, next_id + size)
        failed_before = producer.buffer.failed
        try:
            await producer.send_many([f"{client}:{i}".encode() for i in ids], first_publishing_id=next_id)
        except EnqueueTimeout as exc:  # the first exc.queued were queued: they go on as usual
            ids = range(next_id, next_id + exc.queued)
            for i in range(next_id + exc.queued, next_id + size):
                history.add("refused", client=client, id=i, reason=str(exc))
        for i in ids:
            history.add("send", client=client, id=i)
        next_id += size
        await producer.flush()
        if producer.buffer.failed == failed_before:
            for i in ids:
                history.add("confirm", client=client, id=i)
        else:
            _fail(history, client, ids, "a message of the batch failed", -1)
        await asyncio.sleep(size / rate)


async def _super_stream(env: Any, super_stream: str, history: History, stop: asyncio.Event, rate: float) -> None:
    """A named super-stream producer (key routing by hash; one id sequence over the partitions) and a
    super-stream consumer, recorded per partition."""
    from smartclient import Confirmation, EnqueueTimeout

    client = "p-super"

    def on_message(message: Any, context: Any) -> None:
        history.add("deliver", client=f"c-super-{context.stream}", stream=context.stream, offset=context.offset)

    consumer = await env.super_stream_consumer(super_stream, on_message, offset="first")
    producer = await env.super_stream_producer(super_stream, name=f"nemesis-{client}", key=lambda body: body.decode())

    def confirmed(confirmation: Confirmation) -> None:
        if confirmation.confirmed:
            history.add("confirm", client=client, id=confirmation.publishing_id)
        else:
            _fail(history, client, [confirmation.publishing_id], str(confirmation.reason or ""), confirmation.code)

    next_id = 1
    while not stop.is_set():
        try:
            await producer.send(f"{client}:{next_id}".encode(), publishing_id=next_id, on_confirm=confirmed)
        except EnqueueTimeout as exc:
            history.add("refused", client=client, id=next_id, reason=str(exc))
        else:
            history.add("send", client=client, id=next_id)
        next_id += 1
        await asyncio.sleep(1.0 / rate)
    await asyncio.wait_for(producer.flush(), 60)
    await producer.close()
    await consumer.close()
