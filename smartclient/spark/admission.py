"""Admission control for the stream source: where a micro-batch may end, and whether it may start yet.

Pure decisions (no Spark, no broker), made on the driver from ``{stream: offset}`` maps:

* :func:`cap_batch_end`: at most ``max_records`` records, and at most about ``max_bytes`` bytes, past
  ``start``, shared out evenly over the streams, what one stream cannot use going to the others;
* :func:`hold_batch`: ``minOffsetsPerTrigger``: too few new records, and the last batch was not long ago;
* :func:`duration_seconds`: ``maxTriggerDelay`` as Spark writes durations (``30s``, ``5m``, ``1h``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from smartclient._errors import ConfigurationError

__all__ = ["DEFAULT_RECORD_BYTES", "cap_batch_end", "duration_seconds", "hold_batch", "new_records"]

DEFAULT_RECORD_BYTES = 1024.0  # a stream whose records were not sampled counts this much per record


def _share(room: Mapping[str, int], budget: float, cost: Mapping[str, float]) -> dict[str, int]:
    """How many of its ``room`` records each stream takes, each record costing ``cost[stream]`` of
    ``budget``: the budget is shared out evenly over the streams that have records left, again and again,
    until it is spent or nothing is left; shares too small for a whole record go a record at a time, in
    the order of ``room``.  The answer depends on its arguments only."""
    take = dict.fromkeys(room, 0)
    hungry = [stream for stream, free in room.items() if free > 0]
    while budget > 0 and hungry:
        share = budget / len(hungry)
        moved = False
        for stream in hungry:
            got = min(int(min(share, budget) // cost[stream]), room[stream] - take[stream])
            if got > 0:
                take[stream] += got
                budget -= got * cost[stream]
                moved = True
        if not moved:  # every share is under a record: whole records in order, while the budget lasts
            for stream in hungry:
                if cost[stream] <= budget:
                    take[stream] += 1
                    budget -= cost[stream]
                    moved = True
        if not moved:
            break
        hungry = [stream for stream in hungry if take[stream] < room[stream]]
    return take


def cap_batch_end(start: Mapping[str, int], latest: Mapping[str, int], max_records: int | None = None, *,
                  max_bytes: int | None = None, record_bytes: Mapping[str, float] | None = None) -> dict[str, int]:
    """The end of a micro-batch that starts at ``start`` and may reach ``latest``, holding at most
    ``max_records`` records over all streams, and records of at most ``max_bytes`` bytes in all, a record
    of a stream counting ``record_bytes[stream]`` (an estimate; :data:`DEFAULT_RECORD_BYTES` where not
    given).  With ``max_bytes``, a batch still takes one record when even that one is over the budget, so
    a query never stalls on a large message.

    No stream goes back: one whose latest offset is behind its start (a stream deleted and created again)
    stays where it is.  A stream that ``start`` does not have is given its latest offset, as an uncapped
    batch would.
    """
    room = {stream: max(latest.get(stream, first) - first, 0) for stream, first in start.items()}
    take = dict(room)
    if max_records is not None:
        take = _share(take, max_records, dict.fromkeys(take, 1.0))
    if max_bytes is not None:
        sizes = record_bytes or {}
        cost = {stream: max(float(sizes.get(stream, DEFAULT_RECORD_BYTES)), 1.0) for stream in take}
        capped = _share(take, max_bytes, cost)
        if not any(capped.values()):  # one record over the budget: it goes alone
            first = next((stream for stream, n in take.items() if n > 0), None)
            if first is not None:
                capped[first] = 1
        take = capped
    end = {stream: first + take[stream] for stream, first in start.items()}
    return {**latest, **end}


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
