"""What the stream wing adds to its Environment's telemetry (:mod:`smartclient.telemetry`, the face's).

Its readings are *observed*: the reader's collection reads counters the client keeps anyway (each producer's sent,
confirmed and failed counts, each consumer carrier's per-stream counts, the connector's sessions and mismatches), so
the publish and deliver paths pay nothing for them.  A producer or consumer that closes leaves its totals behind
(:meth:`StreamTelemetry.retire`), so the counters never go down.  Placement times, publish-to-confirm times and chunk
sizes are recorded into the face's instruments when they happen.  The consumer lag gauge reads the last sample of the
wing's lag sampler (:mod:`smartclient.stream.lag`), which its first collection starts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from smartclient.core.topology import Role
from smartclient.stream.lag import lag_sampler
from smartclient.telemetry import SYSTEM, EnvironmentTelemetry, on_stream

__all__ = ["StreamTelemetry"]

_PRODUCER_COUNTS = {"published": "sent", "confirmed": "confirmed", "errored": "failed", "resent": "resent"}


class StreamTelemetry:
    """The stream wing's readings and records, into ``telemetry`` (``carriers`` holds its handles, placement and
    connector)."""

    def __init__(self, carriers: Any, telemetry: EnvironmentTelemetry) -> None:  # carriers: a Carriers
        self.carriers = carriers
        self.telemetry = telemetry
        self.timed = telemetry.timed  # publish-to-confirm times are taken (a little work per Publish frame)
        self.lock = telemetry.lock
        self.retired: dict[str, Counter[str]] = {key: Counter() for key in (*_PRODUCER_COUNTS, "recoveries")}
        telemetry.add({
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
            "smartclient.placement.sessions": lambda: [(carriers.placement.connector.opened, SYSTEM)],
            "smartclient.placement.mismatches": self._mismatches,
            "smartclient.placement.reused": lambda: [(carriers.placement.connector.reused, SYSTEM)],
            "smartclient.recoveries": self._recoveries,
            "smartclient.consumer.lag": self._lag,
        })
        telemetry.time_resolution(carriers.placement.connector.resolution)
        carriers.placement.on_placed = self.placed

    # -- readings (called by the reader's collection) --------------------------------------------------
    def _producers(self, what: str) -> Iterable[tuple[float, dict[str, str]]]:
        """Per stream: a producer count (``what`` in _PRODUCER_COUNTS, closed handles' totals included), or the
        messages in flight (``in_flight``: live handles only)."""
        totals = Counter(self.retired.get(what, {}))
        attribute = _PRODUCER_COUNTS.get(what, what)
        for handle in list(self.carriers.handles):
            if handle.role is Role.PRODUCER and (buffer := getattr(handle, "buffer", None)) is not None:
                totals[handle.stream] += getattr(buffer, attribute)
        return [(value, on_stream(stream)) for stream, value in sorted(totals.items())]

    def _consumers(self, what: str) -> Iterable[tuple[float, dict[str, str]]]:
        totals: Counter[str] = Counter(dict(self.carriers.left.get(what, {})))  # closed subscriptions' counts
        for carrier in self.carriers.carriers(Role.CONSUMER):
            totals.update(dict(getattr(carrier, what, {})))  # a copy: the event loop adds streams meanwhile
        return [(value, on_stream(stream)) for stream, value in sorted(totals.items())]

    def _connections(self) -> Iterable[tuple[float, dict[str, str]]]:
        by_node = Counter(str(c.node) for c in list(self.carriers.placement.connector.connections))
        return [(n, {**SYSTEM, "server.node": node}) for node, n in sorted(by_node.items())] or [(0, SYSTEM)]

    def _placements(self) -> Iterable[tuple[float, dict[str, str]]]:
        counts = Counter((str(r.node), r.role.value) for r in self.carriers.placement.placements())
        return [(n, {**SYSTEM, "server.node": node, "smartclient.role": role})
                for (node, role), n in sorted(counts.items())]

    def _mismatches(self) -> Iterable[tuple[float, dict[str, str]]]:
        found = self.carriers.placement.connector.mismatches
        return [(n, {**SYSTEM, "smartclient.reason": reason}) for reason, n in sorted(found.items())] or \
            [(0, {**SYSTEM, "smartclient.reason": "another node"})]

    def _recoveries(self) -> Iterable[tuple[float, dict[str, str]]]:
        totals = Counter(self.retired["recoveries"])
        for handle in list(self.carriers.handles):
            totals[handle.stream] += handle.recoveries
        return [(value, on_stream(stream)) for stream, value in sorted(totals.items())]

    def _lag(self) -> Iterable[tuple[float, dict[str, str]]]:
        """Per stream and consumer name (none for unnamed consumers), the lag furthest behind at the last sample;
        a super stream's partition says which (``smartclient.super_stream``)."""
        supers = {h.stream: h.super_stream for h in list(self.carriers.handles) if h.super_stream is not None}
        return [(lag, {**on_stream(stream), **({"messaging.consumer.group.name": name} if name else {}),
                       **({"smartclient.super_stream": supers[stream]} if stream in supers else {})})
                for (stream, name), lag in sorted(lag_sampler(self.carriers).worst().items(),
                                                  key=lambda item: (item[0][0], item[0][1] or ""))]

    # -- events ------------------------------------------------------------------------------------------
    def confirm_timer(self, stream: str) -> Callable[[float, list[tuple[int, float, int]]], None] | None:
        """Records a producer's publish-to-confirm times: one per confirm frame, from the write of the last
        Publish frame it confirmed (the frame of its highest id)."""
        if not self.timed:
            return None
        attributes = {**on_stream(stream), "messaging.operation.name": "publish", "messaging.operation.type": "send"}
        return lambda now, frames: self.telemetry.confirm_time.record(now - frames[-1][1], attributes)

    def chunk_size(self, stream: str, messages: int) -> None:
        """A chunk arrived for a consumer of ``stream`` (recorded only when ``timed``: once per chunk)."""
        self.telemetry.chunk_sizes.record(messages, on_stream(stream))

    def placed(self, role: Role, seconds: float, sessions: int) -> None:
        attributes = {**SYSTEM, "smartclient.role": role.value}
        self.telemetry.placement_time.record(seconds, attributes)
        self.telemetry.placement_sessions.record(sessions, attributes)

    def retire(self, handle: Any) -> None:
        """A closing handle's totals stay counted."""
        self.retired["recoveries"][handle.stream] += handle.recoveries
        if handle.role is Role.PRODUCER and getattr(handle, "buffer", None) is not None:
            for what, attribute in _PRODUCER_COUNTS.items():
                self.retired[what][handle.stream] += getattr(handle.buffer, attribute)
