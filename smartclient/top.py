"""``smartclient top``: a live terminal view of one service's smartclient metrics, for an operator at the service.

It reads what the service exports through the OpenTelemetry Prometheus exporter (``docs/observability.md``,
``docs/top.md``), the same instruments a dashboard shows, and draws every ``interval`` seconds:

- where the connections sit: producers and consumers per node and role, AMQP and MQTT clients per node;
- per stream: publish, confirm and consume rates since the last poll, errors, messages waiting for a confirm;
- per consumer (stream and consumer name): its lag, the messages committed and not yet handed to it;
- per super stream: its partitions' lag, the median and the highest, and those falling behind (above
  ``BEHIND_FACTOR`` times the median), the furthest first;
- placement: LB sessions, kept connections reused, node mismatches by reason, recoveries, resent messages;
- the recent events: what those counters gained between two polls, newest first.

No OpenTelemetry here, no Prometheus client: one HTTP GET per poll (urllib) and a parser of the text format.
The parsing, the view and the drawing are pure (:func:`parse`, :func:`view`, :func:`render`).
"""

from __future__ import annotations

import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TextIO

from smartclient._errors import ConfigurationError, ConnectionFailed

__all__ = ["Snapshot", "View", "fetch", "parse", "render", "run", "view"]

Labels = tuple[tuple[str, str], ...]
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_DROPPED = ("otel_scope_", "messaging_system")  # the same on every smartclient series
_OURS = ("smartclient_", "rabbitmq_stream_", "messaging_client_")
BEHIND_FACTOR = 3.0  # a partition whose lag is above this many times its super stream's median is behind ...
BEHIND_FLOOR = 100.0  # ... if it is at least this many messages behind (a few messages is no one falling behind)
SHOWN_PARTITIONS = 8  # the partitions a super stream's section lists, the furthest behind first


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def parse(text: str) -> dict[tuple[str, Labels], float]:
    """The smartclient series of a Prometheus text exposition: (name, sorted labels) -> value.  Comments,
    other metrics, and the labels every series shares (``otel_scope_*``, ``messaging_system``) are left out."""
    out: dict[tuple[str, Labels], float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or not match.group(1).startswith(_OURS):
            continue
        name, labels, value = match.groups()
        pairs = tuple(sorted((k, _unescape(v)) for k, v in _LABEL.findall(labels or "")
                             if not k.startswith(_DROPPED)))
        try:
            out[(name, pairs)] = float(value)
        except ValueError:
            continue  # not a number: not a sample we read
    return out


@dataclass(frozen=True)
class Snapshot:
    """One poll: when (monotonic seconds) and the series read."""

    at: float
    values: dict[tuple[str, Labels], float]

    def series(self, name: str) -> dict[Labels, float]:
        """The series of one instrument, whichever suffix the exporter gave it (``_total``, ``_seconds``)."""
        return {labels: v for (n, labels), v in self.values.items()
                if n in (name, f"{name}_total", f"{name}_seconds")}

    def total(self, name: str) -> float:
        return sum(self.series(name).values())

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """An instrument summed by the given labels."""
        out: dict[tuple[str, ...], float] = {}
        for labels, value in self.series(name).items():
            got = dict(labels)
            key = tuple(got.get(k, "") for k in keys)
            out[key] = out.get(key, 0.0) + value
        return out


@dataclass
class StreamRow:
    stream: str
    published: float
    publish_rate: float | None
    confirm_rate: float | None
    consume_rate: float | None
    errored: float
    outstanding: float


@dataclass
class ConsumerRow:
    stream: str
    name: str  # the consumer's name, "" for unnamed ones (the one furthest behind)
    lag: float


@dataclass
class SuperStreamRow:
    """A super stream's partitions as its consumers see them: each partition's lag (the largest of its consumers'
    names), furthest behind first."""

    super_stream: str
    lags: list[tuple[str, float]]

    @property
    def median(self) -> float:
        values = sorted(lag for _, lag in self.lags)
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    def behind(self) -> list[tuple[str, float]]:
        """The partitions above ``BEHIND_FACTOR`` times the median and ``BEHIND_FLOOR``."""
        bar = max(BEHIND_FACTOR * self.median, BEHIND_FLOOR)
        return [(p, lag) for p, lag in self.lags if lag > bar]


def _super_streams(current: Snapshot) -> list[SuperStreamRow]:
    lags: dict[str, dict[str, float]] = {}
    for (stream, parent, _), lag in current.by("smartclient_consumer_lag", "messaging_destination_name",
                                                "smartclient_super_stream", "messaging_consumer_group_name").items():
        if parent:
            partitions = lags.setdefault(parent, {})
            partitions[stream] = max(lag, partitions.get(stream, 0.0))
    return [SuperStreamRow(parent, sorted(partitions.items(), key=lambda item: (-item[1], item[0])))
            for parent, partitions in sorted(lags.items())]


@dataclass
class View:
    """What one frame shows (``None`` rates: the first poll, nothing to compare with)."""

    connections: dict[tuple[str, ...], float] = field(default_factory=dict)  # (node, role) -> placements
    clients: dict[tuple[str, ...], float] = field(default_factory=dict)  # (protocol, node) -> clients
    stream_connections: float = 0.0
    stream_connections_by_node: dict[str, float] = field(default_factory=dict)  # node -> open stream connections
    super_streams: list[SuperStreamRow] = field(default_factory=list)
    streams: list[StreamRow] = field(default_factory=list)
    consumers: list[ConsumerRow] = field(default_factory=list)  # lag per stream and consumer name (not partitions)
    sessions: float = 0.0
    reused: float = 0.0
    mismatches: dict[str, float] = field(default_factory=dict)  # reason -> total
    recoveries: float = 0.0
    resent: float = 0.0
    recovery_mean: float | None = None
    events: list[str] = field(default_factory=list)  # what changed since the previous poll


def _rate(name: str, stream: str, previous: Snapshot | None, current: Snapshot) -> float | None:
    if previous is None or current.at <= previous.at:
        return None
    key = "messaging_destination_name"
    now = current.by(name, key).get((stream,), 0.0)
    before = previous.by(name, key).get((stream,), 0.0)
    return max(0.0, now - before) / (current.at - previous.at)


def _gains(name: str, keys: tuple[str, ...], previous: Snapshot | None, current: Snapshot) -> Iterable[
        tuple[tuple[str, ...], float]]:
    if previous is None:
        return []
    before = previous.by(name, *keys)
    return [(key, value - before.get(key, 0.0)) for key, value in sorted(current.by(name, *keys).items())
            if value - before.get(key, 0.0) > 0]


def view(previous: Snapshot | None, current: Snapshot) -> View:
    """The frame for ``current``, with rates and events against ``previous`` (None: the first poll)."""
    stream = "messaging_destination_name"
    streams = sorted({s for (s,) in current.by("rabbitmq_stream_published", stream)}
                     | {s for (s,) in current.by("rabbitmq_stream_consumed", stream)})
    published = current.by("rabbitmq_stream_published", stream)
    errored = current.by("rabbitmq_stream_errored", stream)
    outstanding = current.by("rabbitmq_stream_outstanding_publish_confirm", stream)
    v = View(
        connections=current.by("smartclient_connections", "server_node", "smartclient_role"),
        clients=current.by("smartclient_clients", "network_protocol_name", "server_node"),
        stream_connections=current.total("rabbitmq_stream_connections"),
        stream_connections_by_node={node: n for (node,), n in current.by("rabbitmq_stream_connections",
                                                                          "server_node").items() if node and n},
        super_streams=_super_streams(current),
        streams=[StreamRow(s, published.get((s,), 0.0), _rate("rabbitmq_stream_published", s, previous, current),
                           _rate("rabbitmq_stream_confirmed", s, previous, current),
                           _rate("rabbitmq_stream_consumed", s, previous, current),
                           errored.get((s,), 0.0), outstanding.get((s,), 0.0)) for s in streams],
        consumers=[ConsumerRow(s, name, lag) for (s, name, parent), lag in sorted(
            current.by("smartclient_consumer_lag", stream, "messaging_consumer_group_name",
                       "smartclient_super_stream").items()) if not parent],
        sessions=current.total("smartclient_placement_sessions"),
        reused=current.total("smartclient_placement_reused"),
        mismatches={reason: n for (reason,), n in current.by("smartclient_placement_mismatches",
                                                               "smartclient_reason").items() if n},
        recoveries=current.total("smartclient_recoveries"),
        resent=current.total("smartclient_recovery_resent"),
    )
    count = current.total("smartclient_recovery_duration_seconds_count")
    if count:
        v.recovery_mean = current.total("smartclient_recovery_duration_seconds_sum") / count
    for (reason,), n in _gains("smartclient_placement_mismatches", ("smartclient_reason",), previous, current):
        v.events.append(f"{n:g} node mismatch(es): {reason}")
    for (s,), n in _gains("smartclient_recoveries", (stream,), previous, current):
        v.events.append(f"{n:g} recovery(ies) on {s}")
    for (s,), n in _gains("smartclient_recovery_resent", (stream,), previous, current):
        v.events.append(f"{n:g} message(s) sent again on {s}")
    for (s,), n in _gains("rabbitmq_stream_errored", (stream,), previous, current):
        v.events.append(f"{n:g} message(s) failed on {s}")
    return v


def _rate_text(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.0f}/s"


def render(v: View, recent: Iterable[str] = (), source: str = "", error: str | None = None) -> str:
    """One frame as plain text."""
    lines = [f"smartclient top  {source}".rstrip()]
    if error:
        lines.append(f"!! {error}")
    lines.append("")
    per_node = ", ".join(f"{node} {n:g}" for node, n in sorted(v.stream_connections_by_node.items()))
    lines.append(f"CONNECTIONS  stream connections open: {v.stream_connections:g}" + (f" ({per_node})" if per_node
                                                                                      else ""))
    lines.append(f"  {'NODE':<32} {'ROLE':<10} {'COUNT':>6}")
    for (node, role), n in sorted(v.connections.items()):
        lines.append(f"  {node:<32} {role:<10} {n:>6g}")
    for (protocol, node), n in sorted(v.clients.items()):
        lines.append(f"  {node:<32} {protocol:<10} {n:>6g}")
    if not v.connections and not v.clients:
        lines.append("  (none)")
    lines.append("")
    lines.append(f"STREAMS  {'STREAM':<30} {'PUBLISHED':>11} {'PUBLISH':>11} {'CONFIRM':>11} {'CONSUME':>11} "
                 f"{'ERRORED':>8} {'UNCONFIRMED':>11}")
    for row in v.streams:
        lines.append(f"         {row.stream:<30} {row.published:>11,.0f} {_rate_text(row.publish_rate):>11} "
                     f"{_rate_text(row.confirm_rate):>11} {_rate_text(row.consume_rate):>11} "
                     f"{row.errored:>8,.0f} {row.outstanding:>11,.0f}")
    if not v.streams:
        lines.append("         (none)")
    lines.append("")
    lines.append(f"CONSUMERS  {'STREAM':<30} {'CONSUMER':<20} {'LAG':>11}")
    for consumer in v.consumers:
        lines.append(f"           {consumer.stream:<30} {consumer.name or '-':<20} {consumer.lag:>11,.0f}")
    if not v.consumers:
        lines.append("           (none sampled)" if not v.super_streams else "           (none but partitions)")
    for parent in v.super_streams:
        lines.extend(_super_stream_lines(parent))
    lines.append("")
    mismatches = ", ".join(f"{reason} {n:g}" for reason, n in sorted(v.mismatches.items())) or "none"
    mean = "-" if v.recovery_mean is None else f"{v.recovery_mean:.2f} s"
    lines.append(f"PLACEMENT  LB sessions {v.sessions:g}, kept connections reused {v.reused:g}, "
                 f"mismatches: {mismatches}")
    lines.append(f"RECOVERY   recoveries {v.recoveries:g} (mean {mean}), messages sent again {v.resent:g}")
    lines.append("")
    lines.append("RECENT")
    lines.extend([f"  {line}" for line in recent] or ["  (nothing yet)"])
    return "\n".join(lines)


def _super_stream_lines(row: SuperStreamRow) -> list[str]:
    behind = row.behind()
    shown = max(SHOWN_PARTITIONS, len(behind))
    lines = ["", f"SUPER STREAM  {row.super_stream}: {len(row.lags)} partitions, lag median {row.median:,.0f}, "
                 f"highest {row.lags[0][1]:,.0f}; {len(behind)} behind (above {BEHIND_FACTOR:g}x the median)",
             f"  {'PARTITION':<40} {'LAG':>11}"]
    for partition, lag in row.lags[:shown]:
        lines.append(f"  {partition:<40} {lag:>11,.0f}" + ("  BEHIND" if (partition, lag) in behind else ""))
    if len(row.lags) > shown:
        lines.append(f"  ... {len(row.lags) - shown} more")
    return lines


def fetch(url: str, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic) -> Snapshot:
    """Poll the service's Prometheus endpoint.

    :raises ConfigurationError: ``url`` is not an http(s) URL.
    :raises ConnectionFailed: the endpoint did not answer, or answered with an error."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ConfigurationError(f"--metrics must be an http(s) URL of a Prometheus endpoint, not {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # (the scheme is checked above)
            text = answer.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConnectionFailed(f"could not read {url}: {getattr(exc, 'reason', exc)}") from exc
    return Snapshot(clock(), parse(text))


def run(url: str, interval: float = 2.0, once: bool = False, out: TextIO = sys.stdout,
        keep: int = 12) -> int:
    """Draw a frame every ``interval`` seconds until interrupted (0), or, with ``once``, poll twice
    ``interval`` apart and print one frame without terminal codes (0; 2 when the endpoint fails)."""
    if not interval > 0:
        raise ConfigurationError(f"--interval must be positive, not {interval!r}")
    recent: deque[str] = deque(maxlen=keep)
    previous: Snapshot | None = None
    if once:
        try:
            previous = fetch(url)
            time.sleep(interval)
            current = fetch(url)
        except ConnectionFailed as exc:
            print(f"smartclient top: {exc}", file=sys.stderr)
            return 2
        frame = view(previous, current)
        out.write(render(frame, frame.events, url) + "\n")
        return 0
    try:
        while True:
            error = None
            try:
                current = fetch(url)
            except ConnectionFailed as exc:
                error = str(exc)
            else:
                frame = view(previous, current)
                stamp = time.strftime("%H:%M:%S")
                recent.extendleft(f"{stamp} {event}" for event in frame.events)
                previous = current
            if previous is not None:
                out.write("\x1b[H\x1b[2J" + render(view(None, previous) if error else frame, recent, url, error)
                          + "\n")
            else:
                out.write(f"\x1b[H\x1b[2Jsmartclient top  {url}\n!! {error}\n")
            out.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
