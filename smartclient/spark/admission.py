"""Admission control for the stream source: where a micro-batch may end, and whether it may start yet.

Pure decisions (no Spark, no broker), made on the driver from ``{stream: offset}`` maps:

* :func:`cap_batch_end`: at most ``max_records`` records, and at most about ``max_bytes`` bytes, past
  ``start``, shared out evenly over the streams, what one stream cannot use going to the others;
* :func:`hold_batch`: ``minOffsetsPerTrigger``: too few new records, and the last batch was not long ago;
* :func:`duration_seconds`: ``maxTriggerDelay`` as Spark writes durations (``30s``, ``5m``, ``1h``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping

from smartclient._errors import ConfigurationError

__all__ = ["DEFAULT_RECORD_BYTES", "cap_batch_end", "duration_seconds", "hold_batch", "new_records"]

DEFAULT_RECORD_BYTES = 1024.0  # a stream whose records were not sampled counts this much per record


def _turn(start: Mapping[str, int], count: int) -> int:
    """Which of ``count`` streams goes first this batch: a hash of the start offsets, so the turn moves
    whenever they do, with no stream always last however the offsets advance (the answer depends on the
    arguments only)."""
    if count <= 0:
        return 0
    digest = hashlib.blake2b(",".join(map(str, start.values())).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def _whole(amount: float) -> int:
    """``floor(amount)``, an unlimited budget counting as more records than any stream has."""
    return math.floor(amount) if amount < 2**62 else 2**62


def _share(room: Mapping[str, int], max_records: float, max_bytes: float, cost: Mapping[str, float],
           turn: int) -> dict[str, int]:
    """How many of its ``room`` records each stream takes, within ``max_records`` records and ``max_bytes``
    bytes, a record of a stream costing ``cost[stream]`` bytes (either budget may be ``inf``, not both).

    1. A record each, in turn from stream ``turn``, as long as it fits: a stream of large records never
       waits behind the others' backlog.
    2. The rest is shared out evenly: each stream takes ``level * weight`` records (as far as it has
       them), ``weight`` being how many of its records the tighter budget holds, at the highest level
       both budgets allow (found by bisection: a few dozen passes, whatever the budgets).
    3. What the rounding left goes to the streams in turn, as many records as fit.
    """
    take = dict.fromkeys(room, 0)
    streams = [stream for stream, free in room.items() if free > 0]
    if not streams:
        return take
    order = streams[turn % len(streams):] + streams[:turn % len(streams)]
    left = [float(max_records), float(max_bytes)]

    def give(stream: str, count: int) -> None:
        take[stream] += count
        left[0] -= count
        left[1] -= count * cost[stream]

    for stream in order:
        if left[0] >= 1 and cost[stream] <= left[1]:
            give(stream, 1)
    free = {stream: room[stream] - take[stream] for stream in streams}
    weight = {stream: min(left[0], left[1] / cost[stream]) for stream in streams}

    def at(level: float) -> dict[str, int]:
        return {stream: min(free[stream], math.floor(level * weight[stream])) if weight[stream] > 0 else 0
                for stream in streams}

    def fits(counts: dict[str, int]) -> bool:
        return (sum(counts.values()) <= left[0]
                and sum(n * cost[stream] for stream, n in counts.items()) <= left[1])

    low, high = 0.0, 1.0  # every weight is a whole budget's worth: level 1 overfills unless rooms run out
    if fits(at(high)):
        low = high
    else:
        for _ in range(64):
            middle = (low + high) / 2
            if fits(at(middle)):
                low = middle
            else:
                high = middle
    for stream, count in at(low).items():
        give(stream, count)
    for stream in order:  # what the rounding left: as many as fit, in turn (a cheap stream may fit many)
        fit = min(room[stream] - take[stream], _whole(left[0]), _whole(left[1] / cost[stream]))
        if fit > 0:
            give(stream, fit)
    return take


def cap_batch_end(start: Mapping[str, int], latest: Mapping[str, int], max_records: int | None = None, *,
                  max_bytes: int | None = None, record_bytes: Mapping[str, float] | None = None) -> dict[str, int]:
    """The end of a micro-batch that starts at ``start`` and may reach ``latest``, holding at most
    ``max_records`` records over all streams, and records of at most ``max_bytes`` bytes in all, a record
    of a stream counting ``record_bytes[stream]`` (an estimate; :data:`DEFAULT_RECORD_BYTES` where not
    given).  The budgets are shared out evenly over the streams that have new records, what one cannot
    use going to the others (:func:`_share`).  The streams take turns going first (:func:`_turn`); a
    stream whose record is over ``max_bytes`` goes alone, one record, on its turn, so a query never
    stalls on a large message.

    No stream goes back: one whose latest offset is behind its start (a stream deleted and created again)
    stays where it is.  A stream that ``start`` does not have is given its latest offset, as an uncapped
    batch would.  The streams keep ``start``'s order (Spark compares offsets as JSON text).
    """
    room = {stream: max(latest.get(stream, first) - first, 0) for stream, first in start.items()}
    take = dict(room)
    if max_records is not None or max_bytes is not None:
        sizes = record_bytes or {}
        cost = {stream: max(float(sizes.get(stream, DEFAULT_RECORD_BYTES)), 1.0) if max_bytes is not None else 1.0
                for stream in room}
        hungry = [stream for stream, free in room.items() if free > 0]
        turn = _turn(start, len(hungry))
        if hungry and max_bytes is not None and cost[hungry[turn]] > max_bytes:
            take = dict.fromkeys(room, 0)  # its turn, and its record is over the budget: it goes alone
            take[hungry[turn]] = 1
        else:
            take = _share(room, math.inf if max_records is None else max_records,
                          math.inf if max_bytes is None else max_bytes, cost, turn)
    end = {stream: first + take[stream] for stream, first in start.items()}
    return {**end, **{stream: offset for stream, offset in latest.items() if stream not in end}}


def new_records(start: Mapping[str, int], latest: Mapping[str, int]) -> int:
    """How many records ``latest`` holds past ``start``, over all the streams ``start`` has."""
    return sum(max(latest.get(stream, first) - first, 0) for stream, first in start.items())


def hold_batch(start: Mapping[str, int], latest: Mapping[str, int], min_records: int,
               since_last: float | None, max_delay: float) -> bool:
    """``minOffsetsPerTrigger``: whether the next micro-batch waits, because fewer than ``min_records``
    records are new and the last batch began less than ``max_delay`` seconds ago (``since_last``; ``None``
    before the query's first batch, which never waits, as Kafka's source does)."""
    if since_last is None or since_last >= max_delay:
        return False
    return new_records(start, latest) < min_records


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration_seconds(name: str, raw: str) -> float:
    """A duration option as Spark writes them (``500ms``, ``30s``, ``5m``, ``1h``, ``1d``; a bare number is
    milliseconds, as in Spark's own ``maxTriggerDelay``), in seconds.

    :raises ConfigurationError: not a duration, or not positive.
    """
    match = _DURATION.fullmatch(raw)
    if match is None:
        raise ConfigurationError(f"option {name}={raw!r} is not a duration: write it as 500ms, 30s, 5m, 1h or 1d")
    seconds = float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "ms").lower()]
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigurationError(f"option {name}={raw!r} must be a positive duration")
    return seconds
