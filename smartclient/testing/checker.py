"""The nemesis checker: given the history of a run, prove what reached the streams and what the clients saw.

Pure: it reads a history (a list of records, or a JSON-lines file) and returns a :class:`Report`; it never
talks to a broker, so a saved history can be checked again, and hand-made histories test the checker.

A history record is a dict with ``kind`` and ``t`` (seconds since the run started), and by kind:

* ``send`` / ``confirm`` / ``fail``: ``client`` (a producer), ``id`` (its publishing id); a fail has ``reason``
  and ``code`` (above 0: the broker refused it, so it must not be stored; below 0: the client gave up on it, a
  confirm timeout or a recovery that gave up, so it may or may not be stored: counted apart, as Jepsen's
  indeterminate operations); a send that raised ``EnqueueTimeout`` is ``refused`` instead (never sent);
* ``stored``: ``stream``, ``offset``, ``client`` and ``id`` of a message read back from the stream at the end;
* ``received``: ``client`` (a queue's consumer), ``producer`` and ``id``: a message of a queue (AMQP 1.0, at least
  once) handed to the application; its producer's confirmed ids are checked against these instead of ``stored``,
  and an id received again is counted (``redelivered``), not a failure;
* ``deliver``: ``client`` (a consumer), ``stream``, ``offset``, handed to the application;
* ``subscribe``: ``client`` (a consumer), ``stream``, ``stored_offset`` (the offset stored for its name when it
  (re)subscribed, or None), ``tracked`` (bool);
* ``op``: ``client`` (an RPC or MQTT client), ``ok`` (bool), ``error`` (the type of the failure), and
  ``setup`` (true for a one-off step such as starting the RPC servers: its errors are counted, but it is no
  client that keeps making progress, so it is not timed against the faults that follow it);
* any record may say ``untimed``: its client works now and then (the soak's churn), so it is checked but never
  timed against a fault;
* ``fault`` / ``heal``: ``what`` and ``target``;
* ``leaders``: after a node fault (``kill``, ``stop_app``), when the broker named a live leader for every
  stream again: ``fault_t`` (the fault's ``t``), ``streams`` (stream -> the ``t`` its leader was named) and
  ``missing`` (streams still without one when it gave up);
* ``writable``: after a node fault or a leader move, when each stream took a write again (a raw producer's first
  confirm, :mod:`smartclient.testing.probe`): the same fields as ``leaders``; with ``target`` ``lb``, when the
  load balancer routed again after a restart (for every client, RPC and MQTT too).  The probe's own messages are
  ``send``/``confirm`` of the client ``probe``: checked as stored once, never timed as a client's progress;
* ``fault`` may say ``silent`` (a partition): a client no probe of it follows (RPC, the MQTT fleet; a queue's
  without the ``[amqp10]`` extra) has its own share of it timed from the heal (its broker is whole again then at
  the latest);
* ``uses``: ``client`` and ``stream``, a quorum queue the client writes or reads; ``queue_back``: ``queue`` and
  ``back``, a write its probe had settled (:func:`~smartclient.testing.probe.queues_writable`, a fresh connection
  through the LB every quarter second, from a silent drop until after its heal): such a client's share of a silent
  drop is timed from the first such write once the drop was found (any client's finding before it progressed),
  and is none if it progressed before that write (no fresh client could write sooner), and timed from the finding
  if the probe wrote nothing after it (it had stopped);
* ``found``: ``client``, ``started``: the ``t`` at which the client found its connection dead and began to recover
  (after a silent drop, :mod:`smartclient.testing.partition_run`): its own share of a fault's wait starts there at
  the earliest, and after a silent fault, at the last such finding of any client before its progress (a consumer
  waits for its producer to find the drop too; the findings are measured apart, against their bound);
* ``resources``: a sample of the process's resources (see :mod:`smartclient.testing.soak`), not read here.

What it proves, per producer: every confirmed id is stored exactly once, and the stored ids are in
publishing order; every failed id has a reason; nothing is stored that was never sent or that the broker
refused (an id still in flight at the end, or given up by the client, may be stored: both are counted
apart).  Per consumer: no gap between the first and the last offset it was handed (of the offsets that hold
messages, when the stream was read back: offset tracking spends offsets too), duplicates counted, and a
tracked consumer resumes after its stored offset.
Per fault: how long each client took to make progress after it (worst, p99), how long after the broker had
named every leader again, and the client's own share: from the moment each of its streams took a write again
(the probes of this fault and of any still under way; for a fault no probe follows, the fault itself), or from
when it found its connection dead after a silent drop if that came later, to its first progress since.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartclient._errors import ConfigurationError

__all__ = ["ANCHOR", "ConsumerResult", "ProducerResult", "Report", "check", "is_anchor", "read_history"]

ANCHOR = "anchor-"  # clients named so are the bench's anchor (raw rstream): reported apart, never in ``ok``


def is_anchor(client: str) -> bool:
    return client.startswith(ANCHOR)


PROBE = "probe"  # the writable probe's messages (smartclient.testing.probe): stored, never a client's progress
EVERY = "*"  # a ``writable`` record of the LB (target "lb"): its moment counts for every client

_PROGRESS = {"confirm", "deliver", "received"}


@dataclass
class ProducerResult:
    sent: int = 0
    confirmed: int = 0
    failed: int = 0
    in_flight: int = 0  # sent, neither confirmed nor failed by the end
    lost: list[int] = field(default_factory=list)  # confirmed, not stored
    duplicated: list[int] = field(default_factory=list)  # stored more than once
    out_of_order: list[int] = field(default_factory=list)  # stored after a higher id of the same producer
    failed_without_reason: list[int] = field(default_factory=list)
    unexplained: list[int] = field(default_factory=list)  # stored, but never sent, or refused by the broker
    given_up_stored: int = 0  # failed by the client (confirm timeout, recovery gave up), stored all the same
    redelivered: int = 0  # to a queue (at least once): ids received more than once


@dataclass
class ConsumerResult:
    delivered: int = 0
    first: int | None = None
    last: int | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)  # missing offset ranges, inclusive
    duplicates: int = 0  # offsets handed over more than once
    resumed_before_stored: list[int] = field(default_factory=list)  # first offsets at or below the stored one


@dataclass
class Report:
    producers: dict[str, ProducerResult]
    consumers: dict[str, ConsumerResult]
    progress: dict[str, list[float]]  # client -> seconds from each fault to its next progress
    faults: Counter[str]
    op_errors: dict[str, Counter[str]]  # client -> error type -> count
    ops_ok: Counter[str]
    #: client -> seconds from each fault, or from the last time the broker named every leader again after a node
    #: fault (if that came later), to the client's next progress
    beyond_broker: dict[str, list[float]] = field(default_factory=dict)
    elections: list[float] = field(default_factory=list)  # per node fault: seconds until every leader was named
    #: client -> seconds from the moment its streams took writes again after each fault (or the fault, unprobed)
    #: to its first progress since: the client's own share of the wait
    own: dict[str, list[float]] = field(default_factory=dict)
    unwritable: list[float] = field(default_factory=list)  # per probed fault: seconds until every stream took a write
    #: (client, fault t, progress t, own share) for every fault a client made progress after
    delays: list[tuple[str, float, float, float]] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.count("lost")

    @property
    def duplicated(self) -> int:
        return self.count("duplicated")

    def count(self, what: str, anchor: bool = False) -> int:
        """Ids ``lost`` or ``duplicated`` over smartclient's producers (``anchor``: over the anchor's)."""
        return sum(len(getattr(p, what)) for n, p in self.producers.items() if is_anchor(n) == anchor)

    @property
    def consumer_gaps(self) -> int:
        return sum(len(c.gaps) for c in self.consumers.values())

    def progress_times(self, anchor: bool = False) -> list[float]:
        return sorted(t for client, times in self.progress.items() if is_anchor(client) == anchor for t in times)

    def worst_progress(self, anchor: bool = False) -> float:
        times = self.progress_times(anchor)
        return times[-1] if times else 0.0

    def p99_progress(self, anchor: bool = False) -> float:
        times = self.progress_times(anchor)
        if not times:
            return 0.0
        return times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)]

    def p99_beyond_broker(self) -> float:
        return _p99(t for client, ts in self.beyond_broker.items() if not is_anchor(client) for t in ts)

    def own_times(self, anchor: bool = False) -> list[float]:
        return sorted(t for client, ts in self.own.items() if is_anchor(client) == anchor for t in ts)

    def p99_own(self, anchor: bool = False) -> float:
        """The p99 of the clients' own share of the wait after a fault (see :attr:`own`)."""
        return _p99(self.own_times(anchor))

    @property
    def ok(self) -> bool:
        """Nothing confirmed was lost or stored twice, nothing unexplained was stored, no order broken,
        every failure has a reason, and every consumer is gap-free and resumed after its stored offset."""
        return (self.lost == 0 and self.duplicated == 0 and self.consumer_gaps == 0
                and all(not (p.out_of_order or p.failed_without_reason or p.unexplained)
                        for n, p in self.producers.items() if not is_anchor(n))
                and all(not c.resumed_before_stored for c in self.consumers.values()))

    def summary(self) -> str:
        lines = [f"producers: {len(self.producers)}, confirmed {sum(p.confirmed for p in self.producers.values())}, "
                 f"failed {sum(p.failed for p in self.producers.values())}, lost {self.lost}, "
                 f"duplicated {self.duplicated}, in flight at the end "
                 f"{sum(p.in_flight for p in self.producers.values())}, given up but stored "
                 f"{sum(p.given_up_stored for p in self.producers.values())}"]
        for name, p in sorted(self.producers.items()):
            problems = {k: v[:5] for k, v in (("lost", p.lost), ("duplicated", p.duplicated),
                                              ("out of order", p.out_of_order),
                                              ("failed without reason", p.failed_without_reason),
                                              ("unexplained", p.unexplained)) if v}
            if problems:
                lines.append(f"  {name}: {problems}")
            if p.redelivered:
                lines.append(f"  {name} (a queue, at least once): {p.redelivered} id(s) received more than once")
        delivered = sum(c.delivered for c in self.consumers.values())
        duplicates = sum(c.duplicates for c in self.consumers.values())
        lines.append(f"consumers: {len(self.consumers)}, delivered {delivered}, gaps {self.consumer_gaps}, "
                     f"duplicates {duplicates}")
        for name, c in sorted(self.consumers.items()):
            if c.gaps or c.resumed_before_stored or c.duplicates:
                lines.append(f"  {name}: delivered {c.delivered}, duplicates {c.duplicates}, gaps {c.gaps[:5]}, "
                             f"resumed at or before the stored offset at {c.resumed_before_stored[:5]}")
        lines.append(f"faults: {dict(sorted(self.faults.items()))}")
        lines.append(f"progress after a fault: worst {self.worst_progress():.2f} s, p99 {self.p99_progress():.2f} s "
                     f"({len(self.progress_times())} measured)")
        if self.elections:
            ordered = sorted(self.elections)
            median = ordered[len(ordered) // 2]
            lines.append(f"after a node fault the broker named every leader again in {median:.2f} s "
                         f"(median), {ordered[-1]:.2f} s at worst ({len(ordered)} faults); client progress after "
                         f"that (and after the fault): p99 {self.p99_beyond_broker():.2f} s")
        if self.unwritable:
            ordered = sorted(self.unwritable)
            lines.append(f"after a node fault or leader move every stream took a write again in "
                         f"{ordered[len(ordered) // 2]:.2f} s (median), {ordered[-1]:.2f} s at worst ({len(ordered)} "
                         f"probed); the clients' own share after that: p99 {self.p99_own():.2f} s, worst "
                         f"{max(self.own_times(), default=0.0):.2f} s")
        slowest = sorted(((max(t), c) for c, t in self.progress.items() if t and not is_anchor(c)), reverse=True)
        lines.append("  slowest: " + ", ".join(f"{c} {worst:.2f} s" for worst, c in slowest[:6]))
        if self.progress_times(anchor=True) or any(is_anchor(n) for n in self.producers):
            lines.append(f"anchor (raw rstream, same faults, not in the verdict): lost "
                         f"{self.count('lost', True)}, duplicated {self.count('duplicated', True)}, progress "
                         f"worst {self.worst_progress(True):.2f} s, p99 {self.p99_progress(True):.2f} s")
        for client in sorted(set(self.ops_ok) | set(self.op_errors)):
            lines.append(f"  {client}: {self.ops_ok[client]} ok, errors {dict(self.op_errors.get(client, {}))}")
        return "\n".join(lines)


def _first_since(times: list[float], ready: float) -> float | None:
    """The first of the sorted ``times`` at or after ``ready`` (None: none)."""
    return times[bisect.bisect_left(times, ready)] if times and times[-1] >= ready else None


def _covered(start: float, end: float, windows: list[tuple[float, float]]) -> float:
    """How much of ``start``..``end`` the ``windows`` (began, back) cover, overlaps counted once."""
    total, reach = 0.0, start
    for began, back in sorted(windows):
        began, back = max(began, reach), min(back, end)
        if back > began:
            total += back - began
            reach = back
    return total


def _p99(values: Iterable[float]) -> float:
    times = sorted(values)
    return times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)] if times else 0.0


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """A saved history (JSON lines).

    :raises ConfigurationError: a line is not a JSON object with a ``kind``, naming the line.
    """
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ConfigurationError(f"{path}:{number} is not JSON: {exc}") from None
        if not isinstance(record, dict) or "kind" not in record:
            raise ConfigurationError(f"{path}:{number} is not a history record (a JSON object with a kind)")
        records.append(record)
    return records


def check(history: Iterable[Mapping[str, Any]]) -> Report:
    records = sorted(history, key=lambda r: float(r.get("t", 0.0)))
    producers: dict[str, ProducerResult] = defaultdict(ProducerResult)
    sent: dict[str, set[int]] = defaultdict(set)
    confirmed: dict[str, set[int]] = defaultdict(set)
    failed: dict[str, set[int]] = defaultdict(set)
    refused: dict[str, set[int]] = defaultdict(set)  # failed with a broker code: must not be stored
    stored: dict[str, list[tuple[str, int, int]]] = defaultdict(list)  # client -> (stream, offset, id)
    received: dict[str, list[int]] = defaultdict(list)  # a queue's producer -> the ids its consumers were handed
    consumers: dict[str, ConsumerResult] = defaultdict(ConsumerResult)
    delivered: dict[str, list[int]] = defaultdict(list)
    consumer_stream: dict[str, str] = {}
    uses: dict[str, set[str]] = defaultdict(set)  # a queue client -> the queues it writes or reads (probed)
    queue_backs: dict[str, list[float]] = defaultdict(list)  # a queue -> each time its probe had a write settled
    subscriptions: dict[str, list[int | None]] = defaultdict(list)  # stored offsets at each (re)subscription
    firsts_after_subscribe: dict[str, list[int]] = defaultdict(list)
    awaiting_first: set[str] = set()
    faults: Counter[str] = Counter()
    fault_times: list[float] = []
    progress: dict[str, list[float]] = defaultdict(list)
    waiting: dict[str, list[float]] = defaultdict(list)  # client -> faults it has not progressed since
    progressed: list[tuple[str, float, float]] = []  # (client, fault time, progress time)
    elected: dict[float, float] = {}  # node fault time -> when the broker had named every leader again
    named: dict[str, list[float]] = defaultdict(list)  # stream -> each time a node fault's new leader was named
    #: stream -> (the fault's t, when it took a write again) for each probed fault
    writable: dict[str, list[tuple[float, float]]] = defaultdict(list)
    moments: dict[str, list[float]] = defaultdict(list)  # client -> every time it made progress
    unwritable: list[float] = []
    found: list[float] = []  # when a client found a connection dead (after a silent drop)
    unhealed: dict[tuple[str, str], float] = {}  # a silent fault (a partition) not healed yet -> its t
    healed: dict[float, float] = {}  # a silent fault's t -> when it was healed
    silent: set[float] = set()  # the silent faults' t
    clients: set[str] = set()
    op_errors: dict[str, Counter[str]] = defaultdict(Counter)
    ops_ok: Counter[str] = Counter()

    for r in records:
        kind, t = r["kind"], float(r.get("t", 0.0))
        client = str(r.get("client", ""))
        if kind == "fault":
            faults[str(r.get("what", "?"))] += 1
            fault_times.append(t)
            if r.get("silent"):
                unhealed[(str(r.get("what")), str(r.get("target")))] = t
                silent.add(t)
            for name in clients:
                waiting[name].append(t)
            continue
        timed = not r.get("setup") and not r.get("untimed") and client != PROBE
        if kind in ("send", "confirm", "fail", "deliver", "subscribe", "op", "received") and timed:
            clients.add(client)
        if kind == "leaders":
            elected[float(r["fault_t"])] = t
            for stream, back in dict(r.get("streams") or {}).items():
                named[str(stream)].append(float(back))
            continue
        if kind == "writable":
            backs = [float(back) for back in dict(r.get("streams") or {}).values()]
            for stream, back in dict(r.get("streams") or {}).items():
                writable[str(stream)].append((float(r["fault_t"]), float(back)))
            if r.get("target") == "lb" and backs:  # the LB routes again: for every client, streams or not
                writable[EVERY].append((float(r["fault_t"]), max(backs)))
            if backs and not r.get("missing"):
                unwritable.append(max(backs) - float(r["fault_t"]))
            continue
        if kind == "resources":
            continue
        if kind == "uses":
            uses[client].add(str(r["stream"]))
            continue
        if kind == "queue_back":
            queue_backs[str(r["queue"])].append(float(r["back"]))
            continue
        if kind == "heal" and (at := unhealed.pop((str(r.get("what")), str(r.get("target"))), None)) is not None:
            healed[at] = float(r.get("began", t))  # (when the heal was begun: it takes effect during it)
            continue
        if kind == "found":
            found.append(float(r["started"]))
            continue
        made_progress = timed and (kind in _PROGRESS or (kind == "op" and bool(r.get("ok"))))
        if made_progress:
            moments[client].append(t)
        if made_progress and waiting.get(client):
            progress[client].extend(t - at for at in waiting[client])
            progressed.extend((client, at, t) for at in waiting[client])
            waiting[client] = []
        if kind == "send":
            sent[client].add(int(r["id"]))
        elif kind == "confirm":
            confirmed[client].add(int(r["id"]))
        elif kind == "fail":
            failed[client].add(int(r["id"]))
            if int(r.get("code", 1)) > 0:
                refused[client].add(int(r["id"]))
            if not r.get("reason"):
                producers[client].failed_without_reason.append(int(r["id"]))
        elif kind == "stored":
            stored[client].append((str(r["stream"]), int(r["offset"]), int(r["id"])))
        elif kind == "received":
            received[str(r["producer"])].append(int(r["id"]))
        elif kind == "deliver":
            offset = int(r["offset"])
            delivered[client].append(offset)
            consumer_stream[client] = str(r.get("stream", ""))
            if client in awaiting_first:
                awaiting_first.discard(client)
                firsts_after_subscribe[client].append(offset)
        elif kind == "subscribe":
            subscriptions[client].append(r.get("stored_offset") if r.get("tracked") else None)
            awaiting_first.add(client)
        elif kind == "op":
            if r.get("ok"):
                ops_ok[client] += 1
            else:
                op_errors[client][str(r.get("error", "?"))] += 1

    for client in set(sent) | set(stored) | set(confirmed) | set(received):
        result = producers[client]
        result.sent, result.confirmed, result.failed = len(sent[client]), len(confirmed[client]), len(failed[client])
        result.in_flight = len(sent[client] - confirmed[client] - failed[client])
        if client in received:  # a queue, at least once: each confirmed id received, again is counted
            counts = Counter(received[client])
            result.redelivered = sum(1 for n in counts.values() if n > 1)
            result.lost = sorted(confirmed[client] - set(counts))
            result.unexplained = sorted(i for i in counts if i not in sent[client] or i in refused[client])
            result.given_up_stored = sum(1 for i in counts if i in failed[client] and i not in refused[client])
            continue
        counts = Counter(i for _, _, i in stored[client])
        result.duplicated = sorted(i for i, n in counts.items() if n > 1)
        result.lost = sorted(confirmed[client] - set(counts))
        result.unexplained = sorted(i for i in counts if i not in sent[client] or i in refused[client])
        result.given_up_stored = sum(1 for i in counts if i in failed[client] and i not in refused[client])
        highest: dict[str, int] = {}  # per stream: a super stream's partitions each keep their own order
        for stream, _, i in sorted(stored[client], key=lambda s: (s[0], s[1])):
            if client == PROBE:  # two probes of overlapping faults write one stream from two connections
                break
            if i < highest.get(stream, -1) and counts[i] == 1:
                result.out_of_order.append(i)
            highest[stream] = max(highest.get(stream, -1), i)

    in_stream: dict[str, list[int]] = defaultdict(list)
    for rows in stored.values():
        for stream, offset, _ in rows:
            in_stream[stream].append(offset)
    for offsets in in_stream.values():
        offsets.sort()
    for client, offsets in delivered.items():
        seen = consumers[client]
        seen.delivered = len(offsets)
        unique = sorted(set(offsets))
        seen.duplicates = len(offsets) - len(unique)
        seen.first, seen.last = unique[0], unique[-1]
        messages = in_stream.get(consumer_stream.get(client, ""))
        if messages:  # the offsets that hold messages (a stream also spends offsets on offset-tracking records)
            got = set(unique)
            missing = [o for o in messages if seen.first <= o <= seen.last and o not in got]
            for o in missing:
                if seen.gaps and seen.gaps[-1][1] == o - 1:
                    seen.gaps[-1] = (seen.gaps[-1][0], o)
                else:
                    seen.gaps.append((o, o))
        else:  # nothing read back: every offset between the first and the last counts
            for a, b in itertools.pairwise(unique):
                if b > a + 1:
                    seen.gaps.append((a + 1, b - 1))
        for stored_at, first in zip(subscriptions[client], firsts_after_subscribe[client], strict=False):
            if stored_at is not None and first <= stored_at:
                seen.resumed_before_stored.append(first)

    streams_of: dict[str, set[str]] = defaultdict(set)  # a client's streams: what it stored, or was handed
    for client, rows in stored.items():
        streams_of[client].update(stream for stream, _, _ in rows)
    for client, stream in consumer_stream.items():
        streams_of[client].add(stream)
    for client, queues in uses.items():
        streams_of[client].update(queues)
    beyond: dict[str, list[float]] = defaultdict(list)
    own: dict[str, list[float]] = defaultdict(list)
    delays: list[tuple[str, float, float, float]] = []
    for client, at, t in progressed:  # from the last election of its streams that ended before (faults overlap)
        mine = (*streams_of.get(client, ()), EVERY)
        ended = [end for stream in mine for end in named.get(stream, ()) if at <= end <= t]
        beyond[client].append(t - max([at, *ended]))
        # the client's own share: from the moment its streams took writes again (the probes of this fault, of those
        # before it still under way, and of those that came before the client progressed: faults overlap), or from
        # the fault, to its first progress since then
        windows = [window for stream in mine for window in writable.get(stream, ())]
        ready = max([at, *(back for began, back in windows if began <= t and back >= at)])
        times = moments[client]
        resumed = _first_since(times, ready)
        if resumed is not None and at in silent:
            # after a silent drop, the wait until it was found (any client's finding before this one progressed: a
            # consumer waits for its producer's too; findings are measured apart, against their bound) and, for a
            # client no probe of this fault follows, until the heal, is not the client's own
            later = [f for f in found if at <= f <= resumed]
            backs = sorted(b for queue in uses.get(client, ()) for b in queue_backs.get(queue, ()))
            if backs and any(at <= b <= resumed for b in backs):
                # a queue client: from when a fresh client could write to its queue once the drop was found; none
                # of it if it resumed before the probe's next write (no fresh client could write sooner: the probe
                # tries again at once, several tries at a time, while none settles); from the finding if the probe
                # wrote nothing after it (it had stopped: it says nothing then)
                reference = max([at, *later])
                back = _first_since(backs, reference)
                ready = reference if back is None else back if back <= resumed else resumed
                resumed = _first_since(times, ready)
            else:
                if not any(began == at for began, _ in windows) and at in healed and healed[at] <= resumed:
                    later.append(healed[at])
                if later and max(later) > ready:
                    ready = max(later)
                    resumed = _first_since(times, ready)
        if resumed is not None:
            # a later fault that began meanwhile, while its streams could not be written to: not the client's wait
            mine_own = resumed - ready - _covered(ready, resumed, [w for w in windows if w[0] > ready])
            own[client].append(mine_own)
            delays.append((client, at, t, mine_own))
    elections = [back - at for at, back in elected.items()]
    return Report(dict(producers), dict(consumers), dict(progress), faults, dict(op_errors), ops_ok, dict(beyond),
                  elections, dict(own), unwritable, delays)
