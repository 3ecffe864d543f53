"""A range of a stream read as Arrow: :meth:`Environment.iter_arrow` hands it over in ``RecordBatch`` es (one per
chunk, over the frame it came in), :meth:`Environment.read_arrow` as one ``pyarrow.Table``.

A range read is a chunk consumer like any other: placed on a replica, recovered after a fault from the offset
after the last one handed over (so every offset comes once, in order), with a filter if one is given.  Its
chunks go through a small queue, whose bound holds the consumer's credit back while the reader is slow.

Where it ends: the batch holding offset ``end - 1``, or earlier when nothing a consumer is handed lies between
the offset awaited and ``end``: an offset-tracking chunk (a consumer storing its offset writes one; it takes an
offset and is never delivered), or, with a filter, chunks the broker skipped.  No message says so, so the
reader decides it from what it sees: it has been handed nothing for ``settle`` seconds, the stream's committed
end, as the member the consumer reads from sees it (StreamStats on its node), is at or past ``end``, and a
second consumer, subscribed from the offset awaited, is handed nothing before ``end`` within ``settle`` seconds
either.  A replica that lags only delays the read: until it has committed the range, the read waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from smartclient._errors import DataLoss, TopologyError
from smartclient._pyarrow import arrow, decoded_schema, schema
from smartclient.core.delivery import Chunk
from smartclient.core.filters import StreamFilter
from smartclient.core.offsets import OffsetSpec
from smartclient.core.retry import Backoff
from smartclient.core.stream_arguments import validate_stream_name
from smartclient.core.validation import flag, instance, number, whole
from smartclient.options import ConsumerOptions

__all__ = ["QUEUED_BATCHES", "iter_range", "next_offset", "read_range"]

log = logging.getLogger(__name__)

QUEUED_BATCHES = 16  # chunks read ahead of the reader; the consumer's credit waits beyond
FIRST_CHUNK_POLL = Backoff.steady(0.01)  # a consumer of the last chunk (4.0, to find the end) gets it in ms
UNHANDED_LOOK = 1.0  # ... and if not within this, its member is asked whether it has that chunk at all
_DONE = object()


class _Raise:
    def __init__(self, error: Exception) -> None:
        self.error = error


async def next_offset(env: Any, stream: str, wait: float = 30.0) -> int:
    """The offset the next message of ``stream`` will get: ``committed_offset`` + 1 from StreamStats where the
    broker reports it (RabbitMQ 4.3), otherwise inferred by reading the last committed chunk.

    :raises TopologyError: (without ``committed_offset``) the last chunk could not be read within ``wait`` s.
    """
    stats = await env.stream_stats(stream)
    if "committed_offset" in stats:
        return max(int(stats["committed_offset"]) + 1, 0)  # -1 when the stream is empty
    return await _next_offset_by_reading(env, stream, int(stats.get("committed_chunk_id", -1)), wait)


async def _next_offset_by_reading(env: Any, stream: str, last_chunk: int, wait: float) -> int:
    """Brokers before 4.3 report where the last committed chunk starts (``committed_chunk_id``, -1 when the
    stream is empty), not where it ends: read from there to see its last offset.  A replica that lags only
    delays the answer: it is never mistaken for an empty stream.  A last chunk never handed to a consumer (an
    offset-tracking chunk) is known by the member the consumer reads from having committed it while nothing
    came for :data:`UNHANDED_LOOK` seconds: the end is then taken as its first offset + 1 (the offsets it holds
    are never read)."""
    if last_chunk < 0:
        return 0  # empty
    consumer = await env.consumer(stream, lambda message, context: None,
                                  options=ConsumerOptions(OffsetSpec.at(last_chunk)))
    try:
        began = time.monotonic()
        looked = began
        polls = FIRST_CHUNK_POLL.delays()
        while consumer.last_offset is None and time.monotonic() < began + wait:
            await asyncio.sleep(next(polls))
            if consumer.last_offset is None and time.monotonic() - looked >= UNHANDED_LOOK and consumer.node:
                looked = time.monotonic()
                with contextlib.suppress(TopologyError):
                    member = await env.stream_stats(stream, node=consumer.node)
                    if int(member.get("committed_chunk_id", -1)) >= last_chunk and consumer.last_offset is None:
                        return last_chunk + 1
        last, node = consumer.last_offset, consumer.node
    finally:
        await consumer.close()
    if last is None:
        raise TopologyError(f"the last chunk of {stream!r} (offset {last_chunk}) could not be read within {wait} s "
                            f"(on {node})")
    return int(last) + 1


def iter_range(env: Any, stream: str, start: int, end: int | None, *, filter: Any = None, settle: float = 1.0,
               fail_on_data_loss: bool = True, decode: bool = False, what: str = "Environment.iter_arrow",
               columns: Callable[[Chunk], Any] | None = None,
               loss_hint: str = "fail_on_data_loss=False skips them with a warning") -> AsyncIterator[Any]:
    """See :meth:`Environment.iter_arrow`; every argument is checked here, before any I/O (``what``: the
    method named in the errors).  ``columns``: a chunk's batch (the Spark source makes its own), ``loss_hint``:
    what :class:`DataLoss` says to do instead."""
    validate_stream_name(stream)
    whole(f"{what}.start", start, low=0, note="an offset")
    whole(f"{what}.end", end, low=start, optional=True,
          note="an offset past start, or None: where the stream ends now")
    instance(f"{what}.filter", filter, StreamFilter)
    number(f"{what}.settle", settle, above=0, note="seconds")
    flag(f"{what}.fail_on_data_loss", fail_on_data_loss)
    flag(f"{what}.decode", decode)
    arrow()  # (refused before any I/O when pyarrow is missing)
    if columns is None:
        columns = _decoded if decode else Chunk.to_arrow
    return _iter_range(env, stream, start, end, filter, settle, fail_on_data_loss, columns, loss_hint)


async def _iter_range(env: Any, stream: str, start: int, end: int | None, filter: Any, settle: float,
                      fail_on_data_loss: bool, columns: Callable[[Chunk], Any], loss_hint: str) -> AsyncIterator[Any]:
    if end is None or filter is not None:  # (else the first chunk handed over tells: no read before it)
        stats = await env.stream_stats(stream)
        first_kept = max(int(stats.get("first_chunk_id", 0)), 0)
        if end is None:
            end = await next_offset(env, stream)
        if start < first_kept:  # retention removed the first ones
            gone = min(first_kept, end)
            if gone > start:
                _lost(stream, start, gone, fail_on_data_loss, loss_hint)
            start = max(start, first_kept)
    if end <= start:
        return
    queue: asyncio.Queue[Any] = asyncio.Queue(QUEUED_BATCHES)
    reached = False
    first_seen: list[int] = []  # the first offset of the first chunk handed over

    async def on_chunk(chunk: Chunk) -> None:
        nonlocal reached
        if not first_seen and len(chunk):
            first_seen.append(chunk.first_offset)
        if reached:
            return  # (chunks past the end, before the consumer closes)
        keep = chunk.repeated(end - 1)  # (offsets from ``start`` only: the consumer's skip)
        if keep:
            try:
                batch = columns(chunk.head(keep))  # (what lies past ``end`` is never decoded)
            except Exception as exc:  # (a message a decoding ``columns`` cannot read): the read raises it
                reached = True
                await queue.put(_Raise(exc))
                return
            await queue.put(batch)
        if not reached and len(chunk) and chunk.last_offset >= end - 1:
            reached = True
            await queue.put(_DONE)

    consumer = await env.consumer(stream, on_chunk=on_chunk,
                                  options=ConsumerOptions(OffsetSpec.at(start), filter=filter))
    try:
        async for batch in _batches(env, consumer, queue, stream, start, end, settle, filter, fail_on_data_loss,
                                    loss_hint, first_seen):
            yield batch
    finally:
        # (a loop left early: a chunk may wait in ``on_chunk`` for room in the queue, and the close waits for
        # the chunk being handed over; nothing more is queued, and what is there is dropped)
        reached = True
        while not queue.empty():
            queue.get_nowait()
        await consumer.close()


async def _batches(env: Any, consumer: Any, queue: asyncio.Queue[Any], stream: str, start: int, end: int,
                   settle: float, filter: Any, fail_on_data_loss: bool, loss_hint: str,
                   first_seen: list[int]) -> AsyncIterator[Any]:
    first = True
    while True:
        try:
            # a batch already queued is taken at once (wait_for makes a task and a timer each time: 10 us or so)
            item = queue.get_nowait() if not queue.empty() else await asyncio.wait_for(queue.get(), settle)
        except asyncio.TimeoutError:
            if not queue.empty():
                continue  # (queued as the wait ended)
            if consumer.failure is not None:
                raise consumer.failure from None
            if consumer.recovering or consumer.handing_over:
                continue
            awaited = consumer.waiting_for
            if awaited is not None and awaited >= end:
                return
            if awaited is None or not await _written(env, stream, end, consumer.node):
                continue  # not all written yet (an ``end`` past the stream's): wait for it
            if await _next_handed(env, stream, awaited, settle, filter) < end:
                continue  # more to come
            if not queue.empty() or consumer.waiting_for != awaited or consumer.handing_over:
                continue  # it came meanwhile
            log.debug("%r: nothing to hand over from offset %d to %d (offset-tracking chunks, or chunks a filter "
                      "skipped): the read ends", consumer, awaited, end)
            return
        if first and filter is None and first_seen and first_seen[0] > start:
            # the first offsets were not handed over: retention removed them (the stream's first chunk is past
            # them now), or they are an offset-tracking chunk's
            await _check_loss(env, stream, start, min(first_seen[0], end), fail_on_data_loss, loss_hint)
        first = False
        if item is _DONE:
            return
        if isinstance(item, _Raise):
            raise item.error
        yield item


async def _written(env: Any, stream: str, end: int, node: Any) -> bool:
    """Whether the member on ``node`` (the consumer's: it hands over what it has committed) has committed every
    offset of ``stream`` before ``end``: its ``committed_offset`` (RabbitMQ 4.3).  Before 4.3 the broker tells
    where the last committed chunk starts, not where it ends: a chunk there at ``end - 1`` or later says so, and
    otherwise the stream's end is read (:func:`next_offset`, from its last chunk)."""
    try:
        stats = await env.stream_stats(stream, node=node)
    except TopologyError:  # (the consumer moved since, or the topology did)
        return False
    if "committed_offset" in stats:
        return int(stats["committed_offset"]) + 1 >= end
    if int(stats.get("committed_chunk_id", -1)) >= end - 1:
        return True
    try:
        return await next_offset(env, stream) >= end
    except TopologyError:
        return False


async def _check_loss(env: Any, stream: str, start: int, handed: int, fail: bool, hint: str) -> None:
    """The first offset handed over is past ``start``: if retention removed offsets from ``start`` meanwhile
    (the stream's first chunk is past it now), raise :class:`DataLoss` or warn, as asked."""
    first_kept = max(int((await env.stream_stats(stream)).get("first_chunk_id", 0)), 0)
    gone = min(first_kept, handed)
    if gone > start:
        _lost(stream, start, gone, fail, hint)


def _lost(stream: str, start: int, gone: int, fail: bool, hint: str) -> None:
    what = f"offsets {start} to {gone - 1} of stream {stream!r} are gone: retention removed them"
    if fail:
        raise DataLoss(f"{what} ({hint})", stream, start, gone)
    log.warning("%s; skipped", what)


async def _next_handed(env: Any, stream: str, offset: int, settle: float, filter: Any) -> float:
    """The first offset a consumer subscribed afresh from ``offset`` is handed within ``settle`` seconds
    (infinity if none)."""
    handed: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_chunk(chunk: Chunk) -> None:
        if len(chunk) and not handed.done():
            handed.set_result(chunk.first_offset)

    probe = await env.consumer(stream, on_chunk=on_chunk, options=ConsumerOptions(OffsetSpec.at(offset), filter=filter))
    try:
        return await asyncio.wait_for(asyncio.shield(handed), settle)
    except asyncio.TimeoutError:
        return float("inf")
    finally:
        await probe.close()


def _decoded(chunk: Chunk) -> Any:
    return chunk.to_arrow(decode=True)


async def read_range(env: Any, stream: str, start: int, end: int | None, **options: Any) -> Any:
    """See :meth:`Environment.read_arrow`."""
    batches = iter_range(env, stream, start, end, what="Environment.read_arrow", **options)
    pa, _ = arrow()
    return pa.Table.from_batches([batch async for batch in batches],
                                 schema=decoded_schema() if options.get("decode") else schema())
