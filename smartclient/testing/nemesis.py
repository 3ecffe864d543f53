"""The nemesis: a stream workload placed through the round-robin load balancer while a seeded random schedule
injects the test bed's faults, more than one at a time; the history then goes to :mod:`.checker`.

    python -m smartclient.testing nemesis --minutes 3 --seed 7 [--history run.jsonl]

The schedule (pure, :func:`schedule`) keeps a quorum: at most one node is down (``kill -9`` or ``stop_app``)
at any time, since RabbitMQ 4.3's metadata store (Khepri) and every stream need a majority to progress.
Other faults overlap freely: leader moves, management-API connection closes, an LB backend disabled, LB
sessions cut, an LB restart and the DNS server down.

This first version drives streams only: named producers (``send`` with a confirm callback) on several
streams, a plain and a tracked consumer, and a single-active-consumer pair.  The AMQP RPC loop, the MQTT
fleet and the super stream of issue 18 are not in it yet.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from smartclient.testing.checker import Report, check

__all__ = ["FAULTS", "Fault", "History", "Plan", "run", "schedule"]

log = logging.getLogger(__name__)

#: fault -> whether it takes a node away (only one of those at a time: the quorum stays)
FAULTS: dict[str, bool] = {
    "kill": True, "stop_app": True, "move_leader": False, "close_connection": False, "lb_backend": False,
    "lb_sessions": False, "lb_restart": False, "dns": False,
}


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


def schedule(plan: Plan, nodes: list[str], streams: list[str]) -> list[Fault]:
    """The faults of a run, from its seed alone: the same plan gives the same schedule."""
    rng = random.Random(plan.seed)
    faults: list[Fault] = []
    at = rng.uniform(*plan.gap)
    end = plan.minutes * 60 - max(plan.hold)  # the last fault is healed before the workload stops
    node_down_until = 0.0
    while at < end:
        kinds = [k for k, takes_node in FAULTS.items() if not (takes_node and at < node_down_until)]
        what = rng.choice(kinds)
        hold = rng.uniform(*plan.hold) if what in ("kill", "stop_app", "lb_backend", "dns") else 0.0
        target = rng.choice(streams) if what == "move_leader" else (
            rng.choice(nodes) if what in ("kill", "stop_app", "lb_backend", "lb_sessions") else "")
        if FAULTS[what]:
            node_down_until = at + hold + 5.0  # and a few seconds to rejoin
        faults.append(Fault(round(at, 3), what, target, round(hold, 3)))
        at += rng.uniform(*plan.gap)
    return faults


class History:
    """Every event of a run, in memory and (optionally) as JSON lines."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        self.start = time.monotonic()
        self._file: IO[str] | None = Path(path).open("w") if path else None  # noqa: SIM115  (closed by close())

    def add(self, kind: str, **fields: Any) -> None:
        record = {"kind": kind, "t": round(time.monotonic() - self.start, 4), **fields}
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def _inject(bed: Any, fault: Fault, history: History) -> None:
    """Apply ``fault``, hold it, heal it (each test-bed call off the event loop)."""
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
    else:
        call, heal = bed.stop_dns, bed.start_dns
    history.add("fault", what=fault.what, target=fault.target)
    try:
        await asyncio.to_thread(call)
    except Exception as exc:  # a fault that could not be injected is recorded, not fatal
        history.add("fault_error", what=fault.what, error=f"{type(exc).__name__}: {exc}")
    if heal is not None:
        await asyncio.sleep(fault.hold)
        try:
            await asyncio.to_thread(heal)
        except Exception as exc:
            history.add("fault_error", what=f"heal {fault.what}", error=f"{type(exc).__name__}: {exc}")
        history.add("heal", what=fault.what, target=fault.target)


def _close_one_connection(bed: Any, seed: float) -> None:
    with bed.management() as api:
        ours = [c["name"] for c in api.connections()
                if str((c.get("client_properties") or {}).get("connection_name", "")).startswith("nemesis-")]
    if ours:
        bed.close_connection(random.Random(seed).choice(ours))


async def run(bed: Any, plan: Plan, history_path: str | Path | None = None,
              progress: Callable[[str], None] | None = None) -> Report:
    """Run the workload and the schedule against ``bed`` for ``plan.minutes``; return the checker's report."""
    from resolvers import LoadBalancer
    from smartclient import Confirmation, Environment, OffsetTracking

    say = progress or (lambda text: None)
    history = History(history_path)
    host, port = bed.lb("stream")
    uri = bed.stream_uri(host, port)
    streams = [f"nemesis-{plan.seed}-{i}-{int(time.time())}" for i in range(plan.streams)]
    faults = schedule(plan, [n.name for n in bed.nodes], streams)
    stop = asyncio.Event()
    try:
        async with Environment(uri, resolver=LoadBalancer(f"{host}:{port}"), connection_name="nemesis") as env:
            for stream in streams:
                await env.create_stream(stream, {"initial-cluster-size": 3})

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
                                       single_active=True)

            async def produce(index: int, stream: str) -> None:
                client = f"p{index}"
                producer = await env.producer(stream, name=f"nemesis-{client}")

                def confirmed(confirmation: Confirmation) -> None:
                    if confirmation.confirmed:
                        history.add("confirm", client=client, id=confirmation.publishing_id)
                    else:
                        history.add("fail", client=client, id=confirmation.publishing_id,
                                    reason=str(confirmation.reason or ""))

                next_id, interval = 1, 1.0 / plan.rate
                while not stop.is_set():
                    history.add("send", client=client, id=next_id)
                    await producer.send(f"{client}:{next_id}".encode(), publishing_id=next_id, on_confirm=confirmed)
                    next_id += 1
                    await asyncio.sleep(interval)
                await asyncio.wait_for(producer.flush(), 60)

            producers = [asyncio.create_task(produce(i, s)) for i, s in enumerate(streams)]
            started = time.monotonic()
            injections = []
            for fault in faults:
                await asyncio.sleep(max(0.0, started + fault.at - time.monotonic()))
                say(f"{fault.at:7.1f} s  {fault.what} {fault.target}".rstrip())
                injections.append(asyncio.create_task(_inject(bed, fault, history)))
            await asyncio.gather(*injections)
            await asyncio.sleep(max(0.0, started + plan.minutes * 60 - time.monotonic()))
            stop.set()
            await asyncio.gather(*producers)
            await asyncio.to_thread(bed.heal)
            await _read_back(env, streams, history)
            for stream in streams:
                await env.delete_stream(stream, missing_ok=True)
    finally:
        stop.set()
        history.close()
    return check(history.records)


async def _read_back(env: Any, streams: list[str], history: History) -> None:
    """Every message stored in each stream, from the first offset up to an end marker appended now."""
    for stream in streams:
        marker = (await env.producer(stream))
        await marker.send_wait(b"end")
        done = asyncio.Event()

        def on_message(message: Any, context: Any, stream: str = stream, done: asyncio.Event = done) -> None:
            body = bytes(message)
            if body == b"end":
                done.set()
                return
            client, _, ident = body.decode().partition(":")
            history.add("stored", client=client, stream=stream, offset=context.offset, id=int(ident))

        consumer = await env.consumer(stream, on_message, offset="first")
        await asyncio.wait_for(done.wait(), 120)
        await consumer.close()
        await marker.close()
