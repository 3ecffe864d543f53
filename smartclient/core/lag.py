"""How far a stream consumer is behind its stream: the stream's end, as StreamStats tells it, against the next
offset the consumer would hand over.  Pure: the stream wing's sampler (``smartclient.stream.lag``) does the I/O.

The definition, one for every broker:

- the **end** of a stream is the offset its next message will get: ``committed_offset + 1`` where StreamStats
  reports ``committed_offset`` (RabbitMQ 4.3; -1 when the stream is empty, so the end is 0);
- before 4.3 StreamStats only says where the last committed chunk *starts* (``committed_chunk_id``), not how
  many messages it holds.  The end is then the larger of that and the furthest position a consumer of the stream
  in this process has reached (a consumer is only ever handed committed messages, so that is committed too): a
  lower bound, short by at most the last chunk's messages, exact once a consumer was handed that chunk;
- the **position** of a consumer is the offset it would hand over next: the last offset handed to its callback
  plus one, or where it starts before its first message (``Consumer.waiting_for``), and never before the stream's
  first chunk (retention may have removed what it started at);
- the **lag** is ``end - position``, never below 0: a consumer that has handed over everything committed reads 0;
- but not every offset is a message a consumer is handed: each offset store (offset tracking) is a chunk of the
  stream that takes one offset and is never delivered, and a filter makes the broker skip whole chunks.  Such
  offsets after a consumer's last message would read as lag for ever.  So a consumer that has *settled* reads 0:
  nothing waits for or is in its callback, and neither its position nor the stream's end moved since the
  previous sample, a whole period in which the broker, with the consumer's credit in hand, would have sent any
  message there was (a subscription that went silent anyway is the delivery watch's, which subscribes again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["StreamEnd", "consumer_lag", "has_settled", "worst"]

Mark = tuple[int, int | None]  # (the stream's end, a consumer's position) at one sample


@dataclass(frozen=True)
class StreamEnd:
    """Where a stream ends, from one StreamStats answer.

    :param next_offset: the offset the stream's next message will get (the end).
    :param first_offset: the stream's first offset still stored (``first_chunk_id``; 0 when empty).
    :param exact: whether the broker told the end (``committed_offset``, 4.3) or it is a lower bound (before).
    """

    next_offset: int
    first_offset: int = 0
    exact: bool = True

    @classmethod
    def from_stats(cls, stats: Mapping[str, int], reached: Iterable[int | None] = ()) -> StreamEnd:
        """The end ``stats`` (a StreamStats answer) tells; ``reached``: positions of consumers of the stream
        (None: not known), which bound the end from below when the broker does not tell it."""
        first = max(int(stats.get("first_chunk_id", 0)), 0)
        if "committed_offset" in stats:
            return cls(max(int(stats["committed_offset"]) + 1, 0), first, True)
        known = [int(stats.get("committed_chunk_id", -1)), *(p for p in reached if p is not None)]
        return cls(max(max(known), 0), first, False)


def has_settled(before: Mark | None, now: Mark, idle: bool) -> bool:
    """Whether a consumer has settled (see the module): ``idle`` now (no chunk waiting for or in its callback,
    not recovering), and the end and its position (``now``) as they were at the previous sample (``before``)."""
    return idle and before is not None and before == now and now[1] is not None


def consumer_lag(end: StreamEnd, position: int | None, settled: bool = False) -> int | None:
    """Messages committed to the stream and not yet handed over by a consumer at ``position`` (the next offset
    it would hand over); 0 once it ``settled``; None when its position is not known yet."""
    if position is None:
        return None
    if settled:
        return 0
    return max(0, end.next_offset - max(position, end.first_offset))


def worst(lags: Iterable[tuple[tuple[str, str | None], int | None]]) -> dict[tuple[str, str | None], int]:
    """The largest lag of each (stream, consumer name) among ``lags`` (unknown ones left out): several unnamed
    consumers of a stream, or instances of a name in several Environments, read as the one furthest behind."""
    out: dict[tuple[str, str | None], int] = {}
    for key, lag in lags:
        if lag is not None and lag >= out.get(key, 0):
            out[key] = lag
    return out
