"""The telemetry of one Environment (``docs/observability.md``): the face's, fed by every wing.

One :class:`EnvironmentTelemetry` per Environment holds the meter's instruments (made once per meter and shared by
every Environment on it), the readings each wing adds (:meth:`EnvironmentTelemetry.add`: the stream wing's producers,
consumers, connections and lag), and what spans the wings: the clients per node of the AMQP, AMQP 1.0 and MQTT placers
(:meth:`~EnvironmentTelemetry.watch`), every wing's resolver calls and DNS lookups, and every recovery that ended,
of every wing (:meth:`~EnvironmentTelemetry.recovered`, from the same events the recovery hooks are told).

Most instruments are *observed*: the reader's collection reads counters the client keeps anyway, so the publish and
deliver paths pay nothing for them, and nothing at all when OpenTelemetry is not installed.  Placement, recovery,
resolution and confirm times, and chunk sizes, are recorded when they happen.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from smartclient import _otel
from smartclient.core.recovery import RecoveryEvent

__all__ = ["OBSERVED", "RECORDED", "SYSTEM", "EnvironmentTelemetry", "Reading", "on_stream"]

SYSTEM = {"messaging.system": "rabbitmq"}


def on_stream(stream: str) -> dict[str, str]:
    """The attributes of a measurement about ``stream``."""
    return {**SYSTEM, "messaging.destination.name": stream}


Reading = Callable[[], Iterable[tuple[float, dict[str, str]]]]
AttributeKey = tuple[tuple[str, str], ...]


class _Shared:
    """The instruments of one meter, made once: the SDK hands back the first instrument of a name, with its
    first callbacks, when an Environment asks again.  Each observed reading adds up the live Environments'
    readings (a gauge: the largest, as the consumer lag furthest behind) and, for counters, what closed ones
    left behind.  ``lock`` is held while reading, and by the event loop while a handle's totals move from live
    to retired, so a reading never sees them twice or not at all."""

    def __init__(self, meter: Any) -> None:
        self.meter = meter
        self.lock = threading.Lock()
        self.live: list[EnvironmentTelemetry] = []
        self.left: dict[str, dict[AttributeKey, float]] = {}
        self.instruments = [_otel.observed(meter, name, functools.partial(self.read, name)) for name in OBSERVED]
        self.recorded = {name: _otel.recorded(meter, name) for name in RECORDED}

    def read(self, name: str) -> Iterable[tuple[float, dict[str, str]]]:
        gauge = _otel.INSTRUMENTS[name][0] == "gauge"
        with self.lock:
            totals = dict(self.left.get(name, {}))
            for telemetry in self.live:
                for value, attributes in telemetry.read(name):
                    key = tuple(sorted(attributes.items()))
                    totals[key] = max(totals.get(key, value), value) if gauge else totals.get(key, 0) + value
        return [(value, dict(key)) for key, value in sorted(totals.items())]

    def join(self, telemetry: EnvironmentTelemetry) -> None:
        with self.lock:
            self.live.append(telemetry)

    def leave(self, telemetry: EnvironmentTelemetry) -> None:
        """A closed Environment: its counters' totals stay counted; its gauges and up-down counters go."""
        with self.lock:
            if telemetry not in self.live:
                return
            for name in OBSERVED:
                if _otel.INSTRUMENTS[name][0] == "counter":
                    left = self.left.setdefault(name, {})
                    for value, attributes in telemetry.read(name):
                        key = tuple(sorted(attributes.items()))
                        left[key] = left.get(key, 0) + value
            self.live.remove(telemetry)


_SHARED: dict[int, _Shared] = {}  # id(meter) -> its instruments (the _Shared holds the meter)
_SHARED_LOCK = threading.Lock()


def _shared(meter: Any) -> _Shared:
    with _SHARED_LOCK:
        shared = _SHARED.get(id(meter))
        if shared is None or shared.meter is not meter:
            shared = _SHARED[id(meter)] = _Shared(meter)
        return shared


class EnvironmentTelemetry:
    """The instruments of one Environment, and the readings its wings add."""

    def __init__(self, meter: Any, timed: bool = True) -> None:
        self.timed = timed  # times are recorded (a little work per Publish frame, per chunk, per resolver call)
        self.readings: dict[str, list[Reading]] = {name: [] for name in OBSERVED}
        self.placers: weakref.WeakSet[Any] = weakref.WeakSet()  # the Environment's AMQP, AMQP 1.0 and MQTT placers
        self.resolvers: list[Any] = []  # every wing's resolver contract (DNS lookups)
        self.add({"smartclient.clients": self._placed_clients, "smartclient.dns.lookups": self._dns})
        self.shared = _shared(meter)
        self.lock = self.shared.lock
        recorded = self.shared.recorded
        self.placement_time = recorded["smartclient.placement.duration"]
        self.recovery_time = recorded["smartclient.recovery.duration"]
        self.confirm_time = recorded["messaging.client.operation.duration"]
        self.chunk_sizes = recorded["rabbitmq.stream.chunk_size"]
        self.placement_sessions = recorded["smartclient.placement.attempts"]
        self.resolution_time = recorded["smartclient.resolution.duration"]
        self.shared.join(self)

    def add(self, readings: dict[str, Reading]) -> None:
        """A wing's readings, by instrument name (each a function the reader's collection calls)."""
        for name, reading in readings.items():
            self.readings[name].append(reading)

    def read(self, name: str) -> Iterable[tuple[float, dict[str, str]]]:
        return [point for reading in self.readings[name] for point in reading()]

    def close(self) -> None:
        """The Environment closed: its counters' totals stay in the meter's readings, the rest goes."""
        self.shared.leave(self)

    # -- what spans the wings ------------------------------------------------------------------------------
    def watch(self, placer: Any) -> None:
        """An AMQP, AMQP 1.0 or MQTT placer: its clients are counted per node, its resolver calls timed."""
        self.placers.add(placer)
        self.time_resolution(placer.resolution)

    def time_resolution(self, resolution: Any) -> None:
        """A wing's resolution seam: each resolver call timed, its DNS lookups counted."""
        self.resolvers.append(resolution.contract)
        if self.timed:
            attributes = {**SYSTEM, "smartclient.resolver": resolution.contract.resolver_name}
            resolution.on_resolved = lambda seconds: self.resolution_time.record(seconds, attributes)

    def recovered(self, event: RecoveryEvent) -> None:
        """A recovery ended, of any wing: its time, by stream (or queue, or client), wing, role and outcome."""
        if not event.attempts:
            return  # (recovery off: nothing was attempted, nothing to time)
        handle = event.handle
        where = getattr(handle, "stream", None) or getattr(handle, "queue", None) or getattr(handle, "client_id", "")
        role = getattr(getattr(handle, "role", None), "value", "client")
        self.recovery_time.record(event.seconds, {**on_stream(str(where)), "smartclient.role": role,
                                                  "smartclient.wing": event.wing,
                                                  "smartclient.outcome": "recovered" if event.recovered else "gave up"})

    def _placed_clients(self) -> Iterable[tuple[float, dict[str, str]]]:
        counts: Counter[tuple[str, str, str]] = Counter()
        for placer in _copy(self.placers):  # AMQP 1.0 says its version: its listener is AMQP 0.9.1's
            for node, n in placer.clients_per_node().items():
                counts[(placer.protocol, getattr(placer, "protocol_version", ""), node)] += n
        return [(n, {**SYSTEM, "network.protocol.name": protocol, "server.node": node,
                     **({"network.protocol.version": version} if version else {})})
                for (protocol, version, node), n in sorted(counts.items())]

    def _dns(self) -> Iterable[tuple[float, dict[str, str]]]:
        """Lookups of the DNS resolvers in use (every wing's, a chain's steps): asked, or from the cache."""
        resolvers, seen = list(self.resolvers), list[Any]()
        while resolvers:
            resolver = resolvers.pop()
            resolvers.extend(resolver.parts())  # a Chain's steps
            if resolver.cache_counts() is not None and all(resolver is not r for r in seen):
                seen.append(resolver)
        if not seen:
            return []
        counts = [r.cache_counts() for r in seen]
        return [(sum(c[0] for c in counts), {**SYSTEM, "smartclient.cache": "miss"}),
                (sum(c[1] for c in counts), {**SYSTEM, "smartclient.cache": "hit"})]


def _copy(items: Iterable[Any]) -> list[Any]:
    """A copy of a set the event loop may change while the reader's thread copies it."""
    for _ in range(8):
        try:
            return list(items)
        except RuntimeError:  # "changed size during iteration": try again
            continue
    return []


OBSERVED = (
    "rabbitmq.stream.published", "messaging.client.sent.messages", "rabbitmq.stream.confirmed",
    "rabbitmq.stream.errored", "smartclient.recovery.resent", "rabbitmq.stream.outstanding_publish_confirm",
    "rabbitmq.stream.consumed", "messaging.client.consumed.messages", "rabbitmq.stream.chunk",
    "rabbitmq.stream.connections", "smartclient.connections", "smartclient.placement.sessions",
    "smartclient.placement.mismatches", "smartclient.placement.reused", "smartclient.recoveries",
    "smartclient.clients", "smartclient.dns.lookups", "smartclient.consumer.lag",
)
RECORDED = (
    "smartclient.placement.duration", "smartclient.recovery.duration", "messaging.client.operation.duration",
    "rabbitmq.stream.chunk_size", "smartclient.placement.attempts", "smartclient.resolution.duration",
)
