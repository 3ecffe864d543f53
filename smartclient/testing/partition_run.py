"""The partition run (issue 55): the nemesis's workload on the namespaced bed in ``lb-only`` mode, under partitions
only (:data:`~smartclient.testing.nemesis.PARTITIONS`), with AMQP 0.9.1 and 1.0 and MQTT QoS 1 on quorum queues
beside the streams; and, from its history, when each silent drop was found.

    python bench/partitions.py --minutes 8

A drop is *found* when a client gives up on the connection it cut: a recovery starts (every wing that recovers by
itself tells ``env.on_recovery``: streams, AMQP 1.0, MQTT), or an AMQP 0.9.1 call or RPC fails; each is a
``found`` record.  Each such moment between a partition
and its heal is timed from the partition; :func:`detections` is pure, so a saved
history is measured again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from smartclient.testing.nemesis import PARTITIONS, Plan, Run

__all__ = ["ONE_WAY", "SILENCING", "WINGS", "Detections", "bounds", "client_of", "detections", "plan",
           "record_recoveries"]


async def record_recoveries(run: Run) -> None:
    """An extra for :func:`~smartclient.testing.nemesis.run`: every recovery the Environment is told of, as a
    ``recovery`` record (``wing``, ``seconds`` it took, ``ok``, ``attempts``, the node ``before`` and ``after``), and
    a ``found`` record (``started``: the history's ``t`` it began)."""
    history = run.history

    def on_recovery(event: Any) -> None:
        t = history.add("recovery", wing=event.wing, seconds=round(event.seconds, 3), ok=event.recovered,
                        cause=str(event.cause)[:120], attempts=event.attempts, before=str(event.before),
                        after=str(event.after))
        history.add("found", client=client_of(event.handle), wing=event.wing, started=round(t - event.seconds, 4))

    run.env.on_recovery(on_recovery)
    watch = _MqttFindings(history)  # paho's own reconnect after the silence watch tells no recovery: its log does
    logging.getLogger(MQTT_WATCH_LOGGER).addHandler(watch)
    try:
        await run.stop.wait()
    finally:
        logging.getLogger(MQTT_WATCH_LOGGER).removeHandler(watch)


#: the logger of MQTT's silence watch (``PahoClient._check_keepalive``): "MQTT client %s: nothing received ..."
MQTT_WATCH_LOGGER = "smartclient.mqtt._paho"
#: how the watch's two endings begin, after "MQTT client <id>: ": silence, and a publish unacknowledged for as long
#: (a publisher, sending every 50 ms, has its oldest message unacknowledged since the cut as long as it has heard
#: nothing: that check comes first)
MQTT_WATCH_ENDINGS = ("nothing received", "no PUBACK for")


class _MqttFindings(logging.Handler):
    """A ``found`` record each time MQTT's silence watch ends a connection (the client reconnects by itself, which
    no recovery event tells when it lands at once), for silence or for a PUBACK that does not come; its client named
    as :func:`client_of` names it.  (Without the second, a publisher's finding was recorded only when its workload
    loop next looked, after its publish's 10 s wait: 14.4 s after a cut, though the watch ended it within 8.)"""

    def __init__(self, history: Any) -> None:
        super().__init__(logging.WARNING)
        self.history = history

    def emit(self, record: logging.LogRecord) -> None:
        said = f"MQTT client {record.args[0]}: " if isinstance(record.args, tuple) and record.args else None
        if said is not None and (text := record.getMessage()).startswith(said) and text[len(said):].startswith(
                MQTT_WATCH_ENDINGS):  # (not an ending for another wing's finding: that one is recorded by its wing)
            client = client_of(SimpleNamespace(client_id=str(record.args[0])))  # type: ignore[index]
            self.history.add("found", client=client, wing="mqtt" if client != "mqtt" else "mqtt-fleet",
                             started=round(record.created - time.time() + time.monotonic() - self.history.start, 4))


#: the partitions that silence the clients' links to a node (the others cut it from its peers: the LB still reaches
#: it, and what its clients see is a leader that commits nothing, found by their watches, not a silent link)
SILENCING = ("isolate", "cut-lb", "cut-lb-one-way")
#: a one-way drop toward the node: its own frames still come until its TCP stalls (at its next frame), which every
#: wing's watch allows for (:func:`smartclient.keepalive.silence_limit`)
ONE_WAY = "cut-lb-one-way"
#: the wings a finding is made by
WINGS = ("stream", "mqtt", "amqp", "amqp10", "rpc", "mqtt-fleet")


def plan(minutes: float, seed: int) -> Plan:
    """The partition run's plan: partitions only, one node at a time, each held 12-25 s (longer than any bound),
    8-16 s apart, and 20 quiet seconds at the end; streams at 100 messages/s per producer, AMQP 1.0 and 0.9.1 and
    MQTT QoS 1 on quorum queues beside them; the Environment's defaults (heartbeat 60 s, dead_after 10 s)."""
    return Plan(minutes=minutes, seed=seed, kinds=tuple(PARTITIONS), gap=(8.0, 16.0), hold=(12.0, 25.0),
                rate=100.0, amqp10=True, queues=True, quiet=20.0)


def client_of(handle: Any) -> str:
    """The nemesis's name for the client whose ``handle`` recovered ("" if none: a reader at the end)."""
    name, stream = str(getattr(handle, "name", "") or ""), str(getattr(handle, "stream", "") or "")
    client_id = str(getattr(handle, "client_id", "") or "")
    kind = type(handle).__name__
    if name.startswith("nemesis-p"):
        return name.removeprefix("nemesis-")  # p0, p-many, p-super
    if name in ("nemesis-tracked", "nemesis-sac"):
        return name.replace("nemesis-", "c-")
    if not name and "-super-" in stream:
        return f"c-super-{stream}"
    if not name and stream.endswith("-0") and kind == "Consumer":
        return "c-plain"
    if client_id.endswith("-q1-p"):
        return "mqtt-p"
    if client_id.endswith("-q1-s"):
        return "mqtt-c"
    if client_id:
        return "mqtt"  # the fleet's
    if kind.startswith("Amqp10") or "amqp10" in type(handle).__module__:
        return "amqp10-p" if "Publisher" in kind else "amqp10-c"
    return ""


def bounds(dead_after: float) -> dict[str, float]:
    """The documented bound of each wing (docs/reliability.md, "Partitions and silent networks"): ``dead_after``,
    one way or both, for every one (streams, AMQP 0.9.1 and its RPC, AMQP 1.0, MQTT and its fleet)."""
    return dict.fromkeys(WINGS, float(dead_after))


@dataclass
class Detections:
    """Per wing, the seconds from each partition to each moment a client found a connection dead after it."""

    times: dict[str, list[float]] = field(default_factory=dict)
    faults: int = 0  #: partitions in the history
    beyond: list[tuple[str, float, str, float]] = field(default_factory=list)  #: (wing, fault t, what, s) over bound

    def worst(self, wing: str) -> float:
        return max(self.times.get(wing, ()), default=0.0)

    def summary(self) -> list[str]:
        lines = [f"silent drops: {self.faults} partitions that silence the clients' links; found (s after the "
                 "partition), per wing:"]
        for wing, times in sorted(self.times.items()):
            ordered = sorted(times)
            median = ordered[len(ordered) // 2] if ordered else 0.0
            lines.append(f"  {wing}: {len(times)} found, median {median:.1f} s, worst {self.worst(wing):.1f} s")
        lines += [f"  beyond its bound: {wing} at {t:.1f} s ({what}): {s:.1f} s" for wing, t, what, s in self.beyond]
        return lines


def detections(records: Iterable[Mapping[str, Any]], limits: Mapping[str, float]) -> Detections:
    """When each partition that silences the clients' links (:data:`SILENCING`) was found, per wing (pure).  A
    moment counts for the latest such partition before it if it came before that partition's heal (after it, a
    client may give up on a connection for other reasons: the cut node's streams changing hands again), once per
    client; one past the wing's bound (``limits``) is listed in :attr:`Detections.beyond`.  (A partition shorter
    than a bound may heal before anything is found: the partition run holds each longer.)"""
    cuts: list[tuple[float, str]] = []  # (t, what)
    heals: list[float] = []
    found: list[tuple[float, str, str]] = []  # (t, wing, client)
    for r in records:
        kind = r["kind"]
        if kind == "fault" and r["what"] in SILENCING:
            cuts.append((float(r["t"]), str(r["what"])))
        elif kind == "heal" and r["what"] in SILENCING:
            heals.append(float(r["t"]))
        elif kind == "found":
            found.append((float(r["started"]), str(r["wing"]), str(r.get("client") or r["wing"])))
    result = Detections(faults=len(cuts))
    first: set[tuple[int, str]] = set()  # (partition, client): only a client's first finding after it counts
    for t, wing, client in sorted(found):
        before = [(i, c) for i, c in enumerate(cuts) if c[0] <= t]
        if not before:
            continue
        i, (cut, what) = before[-1]
        healed = heals[i] if i < len(heals) else float("inf")
        if t > healed or (i, client) in first:
            continue
        first.add((i, client))
        limit = limits.get(wing, 0.0)
        seconds = round(t - cut, 2)
        result.times.setdefault(wing, []).append(seconds)
        if seconds > limit:
            result.beyond.append((wing, cut, what, seconds))
    return result
