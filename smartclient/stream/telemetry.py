"""OpenTelemetry metrics of one Environment's stream wing (``docs/observability.md``).

Most instruments are *observed*: the reader's collection reads counters the client keeps anyway (each
producer's sent, confirmed and failed counts, each consumer carrier's per-stream counts, the connector's
sessions and mismatches), so the publish and deliver paths pay nothing for them, and nothing at all when
OpenTelemetry is not installed.  A producer or consumer that closes leaves its totals behind (:meth:`retire`),
so the counters never go down.  Placement and recovery times are recorded when they happen (rare events).  The
consumer lag gauge reads the last sample of the Environment's lag sampler (:mod:`smartclient.stream.lag`), which
its first collection starts.
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
from smartclient.core.topology import Role
from smartclient.stream.lag import lag_sampler

__all__ = ["StreamTelemetry"]

_SYSTEM = {"messaging.system": "rabbitmq"}
_PRODUCER_COUNTS = {"published": "sent", "confirmed": "confirmed", "errored": "failed", "resent": "resent"}


def _on(stream: str) -> dict[str, str]:
    return {**_SYSTEM, "messaging.destination.name": stream}


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
        self.live: list[StreamTelemetry] = []
        self.left: dict[str, dict[AttributeKey, float]] = {}
        self.instruments = [_otel.observed(meter, name, functools.partial(self.read, name)) for name in OBSERVED]
        self.recorded = {name: _otel.recorded(meter, name) for name in RECORDED}

    def read(self, name: str) -> Iterable[tuple[float, dict[str, str]]]:
        gauge = _otel.INSTRUMENTS[name][0] == "gauge"
        with self.lock:
            totals = dict(self.left.get(name, {}))
            for telemetry in self.live:
                for value, attributes in telemetry.readings[name]():
                    key = tuple(sorted(attributes.items()))
                    totals[key] = max(totals.get(key, value), value) if gauge else totals.get(key, 0) + value
        return [(value, dict(key)) for key, value in sorted(totals.items())]

    def join(self, telemetry: StreamTelemetry) -> None:
        with self.lock:
            self.live.append(telemetry)

    def leave(self, telemetry: StreamTelemetry) -> None:
        """A closed Environment: its counters' totals stay counted; its gauges and up-down counters go."""
        with self.lock:
            if telemetry not in self.live:
                return
            for name in OBSERVED:
                if _otel.INSTRUMENTS[name][0] == "counter":
                    left = self.left.setdefault(name, {})
                    for value, attributes in telemetry.readings[name]():
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


class StreamTelemetry:
    """The instruments of one Environment (``carriers`` holds its handles, placement and connector)."""

    def __init__(self, carriers: Any, meter: Any, timed: bool = True) -> None:  # carriers: a Carriers
        self.carriers = carriers
        self.timed = timed  # publish-to-confirm times are taken (a little work per Publish frame)
        self.retired: dict[str, Counter[str]] = {key: Counter() for key in (*_PRODUCER_COUNTS, "recoveries")}
        self.placers: weakref.WeakSet[Any] = weakref.WeakSet()  # the Environment's AMQP and MQTT placers
        self.readings: dict[str, Reading] = {
            "rabbitmq.stream.published": lambda: self._producers("published"),
            "messaging.client.sent.messages": lambda: self._producers("published"),
            "rabbitmq.stream.confirmed": lambda: self._producers("confirmed"),
            "rabbitmq.stream.errored": lambda: self._producers("errored"),
            "smartclient.recovery.resent": lambda: self._producers("resent"),
            "rabbitmq.stream.outstanding_publish_confirm": lambda: self._producers("in_flight"),
            "rabbitmq.stream.consumed": lambda: self._consumers("smartclient_consumed"),
            "messaging.client.consumed.messages": lambda: self._consumers("smartclient_consumed"),
            "rabbitmq.stream.chunk": lambda: self._consumers("smartclient_chunks"),
            "rabbitmq.stream.connections": self._connections,
            "smartclient.connections": self._placements,
            "smartclient.placement.sessions": lambda: [(carriers.placement.connector.opened, _SYSTEM)],
            "smartclient.placement.mismatches": self._mismatches,
            "smartclient.placement.reused": lambda: [(carriers.placement.connector.reused, _SYSTEM)],
            "smartclient.recoveries": self._recoveries,
            "smartclient.clients": self._placed_clients,
            "smartclient.dns.lookups": self._dns,
            "smartclient.consumer.lag": self._lag,
        }
        self.shared = _shared(meter)
        self.lock = self.shared.lock
        recorded = self.shared.recorded
        self.placement_time = recorded["smartclient.placement.duration"]
        self.recovery_time = recorded["smartclient.recovery.duration"]
        self.confirm_time = recorded["messaging.client.operation.duration"]
        self.chunk_sizes = recorded["rabbitmq.stream.chunk_size"]
        self.placement_sessions = recorded["smartclient.placement.attempts"]
        self.resolution_time = recorded["smartclient.resolution.duration"]
        self._time_resolution(carriers.placement.connector.resolution)
        carriers.placement.on_placed = self.placed
        self.shared.join(self)

    def close(self) -> None:
        """The Environment closed: its counters' totals stay in the meter's readings, the rest goes."""
        self.shared.leave(self)

    # -- readings (called by the reader's collection) --------------------------------------------------
    def _producers(self, what: str) -> Iterable[tuple[float, dict[str, str]]]:
        """Per stream: a producer count (``what`` in _PRODUCER_COUNTS, closed handles' totals included), or the
        messages in flight (``in_flight``: live handles only)."""
        totals = Counter(self.retired.get(what, {}))
        attribute = _PRODUCER_COUNTS.get(what, what)
        for handle in list(self.carriers.handles):
            if handle.role is Role.PRODUCER and (buffer := getattr(handle, "buffer", None)) is not None:
                totals[handle.stream] += getattr(buffer, attribute)
        return [(value, _on(stream)) for stream, value in sorted(totals.items())]

    def _consumers(self, what: str) -> Iterable[tuple[float, dict[str, str]]]:
        totals: Counter[str] = Counter(dict(self.carriers.left.get(what, {})))  # closed subscriptions' counts
        for carrier in self.carriers.carriers(Role.CONSUMER):
            totals.update(dict(getattr(carrier, what, {})))  # a copy: the event loop adds streams meanwhile
        return [(value, _on(stream)) for stream, value in sorted(totals.items())]

    def _connections(self) -> Iterable[tuple[float, dict[str, str]]]:
        return [(len(self.carriers.placement.connector.connections), _SYSTEM)]

    def _placements(self) -> Iterable[tuple[float, dict[str, str]]]:
        counts = Counter((str(r.node), r.role.value) for r in self.carriers.placement.placements())
        return [(n, {**_SYSTEM, "server.node": node, "smartclient.role": role})
                for (node, role), n in sorted(counts.items())]

    def _mismatches(self) -> Iterable[tuple[float, dict[str, str]]]:
        found = self.carriers.placement.connector.mismatches
        return [(n, {**_SYSTEM, "smartclient.reason": reason}) for reason, n in sorted(found.items())] or \
            [(0, {**_SYSTEM, "smartclient.reason": "another node"})]

    def _recoveries(self) -> Iterable[tuple[float, dict[str, str]]]:
        totals = Counter(self.retired["recoveries"])
        for handle in list(self.carriers.handles):
            totals[handle.stream] += handle.recoveries
        return [(value, _on(stream)) for stream, value in sorted(totals.items())]

    def _placed_clients(self) -> Iterable[tuple[float, dict[str, str]]]:
        counts: Counter[tuple[str, str, str]] = Counter()
        for placer in _copy(self.placers):  # AMQP 1.0 says its version: its listener is AMQP 0.9.1's
            for node, n in placer.clients_per_node().items():
                counts[(placer.protocol, getattr(placer, "protocol_version", ""), node)] += n
        return [(n, {**_SYSTEM, "network.protocol.name": protocol, "server.node": node,
                     **({"network.protocol.version": version} if version else {})})
                for (protocol, version, node), n in sorted(counts.items())]

    def _lag(self) -> Iterable[tuple[float, dict[str, str]]]:
        """Per stream and consumer name (none for unnamed consumers), the lag furthest behind at the last sample."""
        return [(lag, {**_on(stream), **({"messaging.consumer.group.name": name} if name else {})})
                for (stream, name), lag in sorted(lag_sampler(self.carriers).worst().items(),
                                                  key=lambda item: (item[0][0], item[0][1] or ""))]

    def _dns(self) -> Iterable[tuple[float, dict[str, str]]]:
        """Lookups of the DNS resolvers in use (the Environment's, a chain's steps): asked, or from the cache."""
        resolvers, seen = [self.carriers.placement.connector.resolution.contract], list[Any]()
        while resolvers:
            resolver = resolvers.pop()
            resolvers.extend(resolver.parts())  # a Chain's steps
            if resolver.cache_counts() is not None and all(resolver is not r for r in seen):
                seen.append(resolver)
        if not seen:
            return []
        counts = [r.cache_counts() for r in seen]
        return [(sum(c[0] for c in counts), {**_SYSTEM, "smartclient.cache": "miss"}),
                (sum(c[1] for c in counts), {**_SYSTEM, "smartclient.cache": "hit"})]

    # -- events ------------------------------------------------------------------------------------------
    def confirm_timer(self, stream: str) -> Callable[[float, list[tuple[int, float, int]]], None] | None:
        """Records a producer's publish-to-confirm times: one per confirm frame, from the write of the last
        Publish frame it confirmed (the frame of its highest id)."""
        if not self.timed:
            return None
        attributes = {**_on(stream), "messaging.operation.name": "publish", "messaging.operation.type": "send"}
        return lambda now, frames: self.confirm_time.record(now - frames[-1][1], attributes)

    def watch(self, placer: Any) -> None:
        """An AMQP or MQTT placer: its clients are counted per node, its resolver calls timed."""
        self.placers.add(placer)
        self._time_resolution(placer.resolution)

    def _time_resolution(self, resolution: Any) -> None:
        if self.timed:
            attributes = {**_SYSTEM, "smartclient.resolver": resolution.contract.resolver_name}
            resolution.on_resolved = lambda seconds: self.resolution_time.record(seconds, attributes)

    def chunk_size(self, stream: str, messages: int) -> None:
        """A chunk arrived for a consumer of ``stream`` (recorded only when ``timed``: once per chunk)."""
        self.chunk_sizes.record(messages, _on(stream))

    def placed(self, role: Role, seconds: float, sessions: int) -> None:
        attributes = {**_SYSTEM, "smartclient.role": role.value}
        self.placement_time.record(seconds, attributes)
        self.placement_sessions.record(sessions, attributes)

    def recovered(self, event: RecoveryEvent) -> None:
        """A recovery ended: its time, by stream, role and outcome."""
        if not event.attempts:
            return  # (recovery off: nothing was attempted, nothing to time)
        handle = event.handle
        outcome = "gave up" if event.failure is not None else "recovered"
        self.recovery_time.record(event.seconds, {**_on(handle.stream), "smartclient.role": handle.role.value,
                                                  "smartclient.outcome": outcome})

    def retire(self, handle: Any) -> None:
        """A closing handle's totals stay counted."""
        self.retired["recoveries"][handle.stream] += handle.recoveries
        if handle.role is Role.PRODUCER and getattr(handle, "buffer", None) is not None:
            for what, attribute in _PRODUCER_COUNTS.items():
                self.retired[what][handle.stream] += getattr(handle.buffer, attribute)


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
