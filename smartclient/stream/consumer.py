"""The consumer handle an Environment returns: a thin wrapper over rstream's subscription, placed on a replica,
recovered after a loss without a gap, handing the application each message or each whole chunk."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from smartclient._errors import (
    REFUSALS,
    CallbackFailed,
    ConfigurationError,
    ConnectionFailed,
    SmartClientError,
    StreamNotReady,
)
from smartclient.core.address import Address
from smartclient.core.deadline import attempt, remaining, step
from smartclient.core.delivery import Chunk, ChunkHandler
from smartclient.core.offsets import OffsetSpec
from smartclient.core.retry import WATCH_POLL, Backoff
from smartclient.core.topology import Role
from smartclient.options import ConsumerOptions, OnError
from smartclient.stream.handles import _Handle
from smartclient.stream.lag import lag_sampler
from smartclient.stream.unreported import DeliveryWatch, move_back, watch

if TYPE_CHECKING:
    from smartclient.stream.host import StreamHost

__all__ = ["Consumer", "consumer_handler"]

log = logging.getLogger(__name__)
#: how soon the broker is asked again, within the bound under way: a first subscription it said was not ready yet,
#: and the stored offset of a single active consumer just activated whose first read failed
AGAIN_SOON = Backoff(initial=0.05, factor=2.0, max=0.5)


async def again_soon(subscribing: Callable[[], Awaitable[None]], consumer: object) -> None:
    """A first subscription, asked again soon within the bound under way when the member was not ready yet (just
    created, an election) or the connection closed under it (the broker ends one whose reader hit a segment that
    retention removed meanwhile; CI saw it once): each new try places it again, on a live connection."""
    delays = AGAIN_SOON.delays()
    while True:
        try:
            return await subscribing()
        except (StreamNotReady, ConnectionFailed) as exc:
            if (isinstance(exc, ConnectionFailed) and not isinstance(exc.__cause__, ConnectionResetError)) or \
                    remaining() <= (pause := next(delays)):
                raise
            log.info("%r: %s: subscribing again", consumer, exc)
            await asyncio.sleep(pause)



class Consumer(_Handle):
    """Reads one stream from a node that hosts a replica (or the leader, as the fallback).

    A *named* consumer can store its offset (:meth:`store_offset`, or :class:`OffsetTracking`) and be one of
    a group of *single active* consumers: one instance of the name receives at a time; when it goes away
    another takes over where the consumer-update handler says (by default: after the last stored offset).

    Lost, or when the stream's members change, it subscribes again, on another member if need be, after
    the last message it handed to the callback: no gap, and with tracking or single active consumer (where
    that offset is known per message) no duplicate; without either, after the last whole chunk delivered.
    A chunk being handed to the callback when the connection is lost is handed over to its end first (an async
    handler is never cancelled), and recovery resumes after it.

    A callback that raises is handled as ``on_error`` says: stop there (:attr:`failure` is a
    :class:`CallbackFailed`), or skip that message (or chunk), counted in :attr:`callback_errors`.
    """

    role = Role.CONSUMER
    # (no __dict__: with some 40 attributes, past the 30 that instances of a class share, each consumer had a dict
    # of its own: 1,817 bytes a consumer with it, 515 without, issue 57)
    __slots__ = ("_chunks", "_closing", "_deliver", "_how", "_last_offset", "_last_store_at", "_on_error",
                 "_since_store", "_skipped", "_start", "_stopping", "_stored", "_storing", "_subscriber", "_tracker",
                 "_tracking", "_untracked", "active", "callback_errors", "offset", "redelivered", "subscription_id")

    def __init__(self, host: StreamHost, carrier: Any, stream: str, name: str | None) -> None:
        super().__init__(host, carrier, stream, name)
        self._closing = False
        self.subscription_id: int | None = None
        self.active: bool | None = None  # for a single active consumer: whether this instance receives now
        self._untracked = False
        self._last_offset: int | None = None
        self.redelivered = 0  # messages at or below the last offset handed over, handed over again (counted, logged)
        self.callback_errors = 0  # messages (or chunks) whose callback raised and that on_error skipped
        self._on_error: OnError = "stop"
        self._subscriber: Any = None  # rstream's subscriber (its offset is the next one after the last chunk)
        self._start: int | None = None  # an absolute start (delivery watch)

    @property
    def last_offset(self) -> int | None:
        """Offset of the last message handed to the callback (without tracking or single active
        consumer, it is read on rstream's subscriber per chunk, so the hot path pays nothing for it)."""
        from smartclient.stream import _rstream

        subscriber = self._subscriber
        if self._untracked and subscriber is not None and (moved := _rstream.position(subscriber)) is not None:
            return moved - 1
        return self._last_offset

    @last_offset.setter
    def last_offset(self, value: int | None) -> None:
        self._last_offset = value

    @property
    def waiting_for(self) -> int | None:  # the next offset it expects, once known (a delivery, an absolute start)
        return max(last + 1, self._start or 0) if (last := self.last_offset) is not None else self._start

    @property
    def lag(self) -> int | None:
        """Messages committed to the stream and not yet handed to the callback (0: caught up), as of the last
        sample: the stream's end minus :attr:`waiting_for`, 0 once it settled (idle, with nothing new for a whole
        period: offset stores and filtered chunks take offsets it is never handed).  See ``docs/observability.md``,
        "Consumer lag".  A sample every 5 s, from the first read on (so the first read is None), one StreamStats
        per stream for all its consumers; nothing per message.  Before RabbitMQ 4.3 it is a lower bound, short
        by at most the stream's last chunk.  None: not sampled yet, its position not known yet (nothing handed
        over from ``"next"``, ``"last"`` or a timestamp on a broker before 4.3), an inactive single active
        consumer, or closed."""
        return None if self.closed else lag_sampler(self._host).lag(self)

    @property
    def handing_over(self) -> bool:  # a chunk waits for, or is in, the callback
        from smartclient.stream._rstream import busy
        return self._subscriber is not None and (busy(self._subscriber) or self.queued_chunks > 0)

    @property
    def queued_chunks(self) -> int:
        """Chunks received and waiting for the callback: at most the flow's ``initial_credit`` (ConsumerFlow)."""
        from smartclient.stream import _rstream

        return _rstream.queued_chunks(self._subscriber) if self._subscriber is not None else 0

    async def _subscribe(self, callback: Callable[..., Awaitable[None] | None], offset: OffsetSpec,
                        options: ConsumerOptions, *, chunks: bool = False, super_stream: str | None = None) -> None:
        """Subscribe from ``offset``, handing each message (or chunk, ``chunks``) to ``callback`` as ``options`` say:
        the consumer's placement.  ``super_stream``: the super stream whose partition its stream is."""
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        single_active, on_update, tracking = options.single_active, options.on_update, options.tracking
        stream_filter = options.filter
        self.offset = offset
        self._on_error = options.on_error
        self._tracking = tracking
        self._stored: int | None = None
        self._since_store = 0
        self._last_store_at = time.monotonic()
        self._tracker: asyncio.Task[None] | None = None
        self._storing: asyncio.Future[None] | None = None
        properties: dict[str, str] | None = None
        listener = None
        if single_active:
            properties = {"single-active-consumer": "true", "name": str(self.name)}
            if super_stream is not None:  # one active consumer per partition across the group
                properties["super-stream"] = super_stream
            self.active = False

            async def consumer_update(is_active: bool, context: Any) -> Any:
                self.active = is_active
                try:
                    if on_update is not None:
                        chosen = on_update(is_active, self)
                        spec = await chosen if inspect.isawaitable(chosen) else chosen
                        self._last_offset = None  # the application chose where to resume, maybe earlier
                    elif is_active:
                        spec = await self._activated()
                    else:
                        spec = OffsetSpec.next()
                except Exception as exc:  # no answer: the broker would hand the group nothing, so it subscribes again
                    self.active = False
                    if not isinstance(exc, SmartClientError):
                        log.error("%r: its on_update raised: it subscribes again", self, exc_info=True)
                    self.control.lost(f"activated, but {type(exc).__name__}: {exc}")
                    raise
                self._start = (parsed := OffsetSpec.parse(spec)).start  # where it resumes (the delivery watch)
                return _rstream.consumer_update_answer(parsed)

            listener = consumer_update

        tracked = tracking is not None
        every = tracking.every if tracking is not None else None

        def after(offset: int, count: int = 1) -> None:
            self.last_offset = offset
            if tracked:
                self._since_store += count
                if every is not None and self._since_store >= every and self._storing is None:
                    self._storing = asyncio.ensure_future(self._auto_store())
                    self._storing.add_done_callback(lambda _: setattr(self, "_storing", None))

        deliver: Callable[..., Any]
        if not tracked and not single_active:
            # nothing to do per message: the delivery loop calls the application directly
            deliver = ChunkHandler(callback) if chunks else callback
            self._untracked = True
        elif chunks:
            def repeats(chunk: Chunk) -> int:  # how many were handed over already: counted, not hidden
                last = self._last_offset
                if last is None or not (count := chunk.repeated(last)):
                    return 0
                self._again(chunk.first_offset, last, None, count)
                return count

            def done(chunk: Chunk, repeated: int) -> None:  # the position never moves back, repeats are not new
                if repeated < len(chunk):
                    after(chunk.last_offset, len(chunk) - repeated)

            async def chunk_async(chunk: Chunk) -> None:
                repeated = repeats(chunk)
                await callback(chunk)  # type: ignore[misc]  # a coroutine function's call
                done(chunk, repeated)

            def chunk_sync(chunk: Chunk) -> Any:
                repeated = repeats(chunk)
                result = callback(chunk)
                done(chunk, repeated)
                return result

            deliver = ChunkHandler(chunk_async if inspect.iscoroutinefunction(callback) else chunk_sync)
        elif inspect.iscoroutinefunction(callback):
            async def deliver_async(message: Any, context: Any) -> Any:
                last = self._last_offset
                if last is not None and context.offset <= last:  # handed over already: counted, not hidden
                    return await self._again(context.offset, last, callback(message, context))
                await callback(message, context)
                after(context.offset)

            deliver = deliver_async
        else:
            # a plain callback gets a plain wrapper: no coroutine per message on the hot path
            def deliver_sync(message: Any, context: Any) -> Any:
                last = self._last_offset
                if last is not None and context.offset <= last:  # handed over already: counted, not hidden
                    return self._again(context.offset, last, callback(message, context))
                result = callback(message, context)
                after(context.offset)
                return result  # a callable object may still return an awaitable; the delivery loop awaits it

            deliver = deliver_sync

        self._how: dict[str, Any] = dict(
            subscriber_name=self.name, properties=properties, consumer_update_listener=listener,
            filter_input=_rstream.filter_config(stream_filter) if stream_filter is not None else None,
        )
        self._deliver = deliver
        self._chunks = chunks
        self._skipped: Callable[[Any], None] = (lambda where: None) if not tracked and not single_active else (
            (lambda chunk: done(chunk, chunk.repeated(last) if (last := self._last_offset) is not None else 0))
            if chunks else (lambda context: after(context.offset)
                            if (last := self._last_offset) is None or context.offset > last else None))
        _rstream.on_callback_error(self._carrier, self.stream, self._callback_raised)

        async def subscribing() -> None:
            self._losses = 0  # (a connection lost before this try held a placement given up: this one is afresh)
            with map_stream_errors(f"subscribing to {self.stream!r}"):
                await self._subscribe_at(offset)

        await again_soon(subscribing, self)
        if tracking is not None and tracking.interval is not None:
            self._tracker = asyncio.create_task(self._track_by_time(tracking.interval))
        self._setup_done()
        self._follow(self._after_recovery("placed"))  # (placed while another consumer of its stream recovered)
        lag_sampler(self._host).attach(asyncio.get_running_loop())
        if self._host.recovery.stall_check and self._host.recovery.enabled and stream_filter is None:
            self._watch = watch(self, self._host, DeliveryWatch)

    async def _subscribe_at(self, offset: OffsetSpec, ready: Callable[[Address], Awaitable[None]] | None = None
                            ) -> None:
        from smartclient.stream import _rstream

        how = dict(self._how)
        if how["properties"] is not None:
            how["properties"] = dict(how["properties"])  # rstream adds the filter keys to it
        if self.active is not None:  # a single active consumer joins its group inactive: the broker says when not
            self.active = False  # (it was active before a recovery, another member may be now: no delivery watch)
        self.subscription_id, self._subscriber = await _rstream.subscribe(
            self._carrier, self.stream, self._deliver, offset, ready, **how)
        self._start = offset.start

    def _subscriber_now(self) -> Any:
        return self._subscriber

    async def _reattach(self) -> str:
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        await _rstream.close_subscriber(self._carrier, self.stream)  # stops delivery first: last_offset is final
        self._last_offset = self.last_offset
        self._subscriber = None
        resume = OffsetSpec.at(self._last_offset + 1) if self._last_offset is not None else self.offset
        with map_stream_errors(f"recovering the consumer on {self.stream!r}"):
            # after a restart or a leader change, the stream's member on the node may still be initialising: the
            # broker's process of the connection would wait for it, with no limit and serving nothing else, so the
            # consumer waits for it on a connection of its own first (Carriers.member_ready)
            await self._subscribe_at(resume, partial(self._host.member_ready, self.stream))
        return f"subscribed again from {resume} (subscription {self.subscription_id})"

    def _after_recovery(self, reason: str) -> Coroutine[Any, Any, None] | None:
        """A consumer placed on a fallback (its first choice could not be read yet) moves back later; a single
        active consumer stays (a move would hand its group's activity over twice)."""
        record = self.placement
        if record is None or not record.fallback or self.active is not None:
            return None
        return move_back(self, self._host)

    def _callback_raised(self, exc: Exception, where: Any) -> bool:
        """The delivery loop's question when the callback raised on ``where`` (a MessageContext, or a Chunk):
        whether delivery goes on with the next message (or chunk).  Never raises."""
        offset: int = where.first_offset if self._chunks else where.offset
        verdict: Any = self._on_error
        if callable(verdict):
            try:
                verdict = verdict(exc, where)
            except Exception as inner:
                log.error("%r: on_error raised %s: %s; stopping at offset %d", self, type(inner).__name__, inner,
                          offset)
                verdict = "stop"
            if verdict not in ("skip", "stop"):
                log.error("%r: on_error returned %r, not 'skip' or 'stop'; stopping at offset %d", self, verdict,
                          offset)
                verdict = "stop"
        what = f"the {'on_chunk handler' if self._chunks else 'callback'} of {self!r}"
        if verdict == "skip":
            self.callback_errors += 1
            log.warning("%s raised %s at offset %d: %s (skipped; %d so far)", what, type(exc).__name__, offset, exc,
                        self.callback_errors, exc_info=self.callback_errors == 1)
            self._skipped(where)
            return True
        failure = CallbackFailed(f"{what} raised {type(exc).__name__} at offset {offset}: {exc}; the consumer "
                                 f"stopped there", self.stream, offset)
        failure.__cause__ = exc
        self.failure = failure
        log.error("%s", failure, exc_info=exc)
        self._stopping = asyncio.get_running_loop().create_task(self._close(flush=True))  # (not from this task)
        return False

    def _again(self, offset: int, last: int, result: Any, count: int = 1) -> Any:
        """``count`` messages handed over again: handed over, counted, and said once in a thousand."""
        before, self.redelivered = self.redelivered, self.redelivered + count
        if before == 0 or before // 1000 != self.redelivered // 1000:
            log.warning("%r got offset %d again (had up to %d): %d repeats", self, offset, last, self.redelivered)
        return result

    async def _activated(self) -> OffsetSpec:
        """The answer to the broker's activation.  Until it goes out, the broker hands the group nothing, so the
        stored offset is read again (on a fresh connection) while one recovery attempt lasts: a rolling restart
        can close the connection under the query (a 2-hour soak found a group silent until the delivery watch
        resubscribed it).  If it still cannot be read, it raises, and the consumer subscribes again at once."""
        delays = AGAIN_SOON.delays()
        with attempt(self._host.recovery.attempt_time, f"reading the stored offset of {self!r}") as deadline:
            while True:
                try:  # (a step: the whole attempt's time bounds the read, a new connection's dial included)
                    return await step("reading the stored offset", self._resume_point())
                except REFUSALS:
                    raise  # a refusal: asking again would repeat it
                except ConnectionFailed as exc:
                    if deadline.remaining() <= (pause := next(delays)):
                        raise
                    log.info("%r: activated, but %s: reading it again", self, exc)
                    await asyncio.sleep(pause)

    async def _resume_point(self) -> OffsetSpec:
        """Where a single active consumer starts when it becomes active: after the stored offset, or
        after its own last message if that is further (it was active before a recovery)."""
        stored = await self.stored_offset()
        after = [value + 1 for value in (stored, self._last_offset) if value is not None]
        return OffsetSpec.at(max(after)) if after else self.offset

    async def _track_by_time(self, interval: float) -> None:
        polls = WATCH_POLL.scaled(interval).delays()
        while not self.closed:
            await asyncio.sleep(next(polls))
            if self._since_store and time.monotonic() - self._last_store_at >= interval:
                await self._auto_store()

    async def _auto_store(self) -> None:
        if self.closed or self.last_offset is None or self.last_offset == self._stored:
            return
        try:
            await self.store_offset(self.last_offset)
        except SmartClientError as exc:  # a later store (or the one on close) will catch up
            log.warning("automatic offset store for %s on %s failed: %s", self.name, self.stream, exc)

    async def store_offset(self, offset: int | None = None) -> None:
        """Store ``offset`` (default: the last one delivered) on the server under this consumer's name."""
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        self._check_open()
        if not self.name:
            raise ConfigurationError(f"storing an offset on {self.stream!r} needs a named consumer")
        value = self.last_offset if offset is None else offset
        if value is None:
            raise ConfigurationError(f"consumer {self.name!r} on {self.stream!r} has no offset to store yet")
        name = self.name
        with map_stream_errors(f"storing the offset of {self.name!r} on {self.stream!r}"):
            # on the connection its QueryOffset goes on (the aside one): the broker reads it back after this store
            await self._host.aside(self.stream, "offset store",
                                   lambda client: _rstream.store_offset(client, self.stream, name, value))
        self._stored = value
        self._since_store = 0
        self._last_store_at = time.monotonic()

    async def stored_offset(self) -> int | None:
        """The offset stored on the server for this consumer's name, or None if there is none (after
        ``close()``, ask :meth:`Environment.stored_offset`)."""
        self._check_open()
        if not self.name:
            raise ConfigurationError(f"querying a stored offset on {self.stream!r} needs a named consumer")
        return await self._host.stored_offset(self.stream, self.name)

    async def _close(self, flush: bool) -> None:
        from smartclient.stream import _rstream

        if self.closed or self._closing:
            return
        self._closing = True
        try:
            await self._stop_recovery()
            tracker = getattr(self, "_tracker", None)
            if tracker is not None:
                tracker.cancel()
            # first nothing more is handed over, the message (or chunk) in the callback finished: the offset stored
            # next covers all it handled, and the callback may still store one itself
            await _rstream.stop_delivery(self._carrier, self.stream)
            if flush and getattr(self, "_tracking", None) is not None and self._since_store:
                with attempt(5.0, f"storing the offset of {self!r}"):
                    await self._auto_store()
        finally:  # even if close() itself is cancelled: the handle ends closed and unsubscribed
            self.closed = True
            await asyncio.shield(self._teardown(_rstream.close_subscriber))

    async def _teardown(self, close: Callable[[Any, str], Awaitable[None]]) -> None:
        try:
            await self._stop_recovery()
            with attempt(5.0, f"closing {self!r}"):
                await close(self._carrier, self.stream)
        finally:
            from smartclient.stream import _rstream

            _rstream.on_callback_error(self._carrier, self.stream, None)
            lag_sampler(self._host).forget(self)
            self._host.release(self)


def consumer_handler(stream: str, callback: Any, on_chunk: Any) -> Callable[..., Any]:
    """The one handler of a consumer on ``stream``: ``callback`` or ``on_chunk``.
    :raises ConfigurationError: both or neither given, or not callable (before any I/O)."""
    if (callback is None) == (on_chunk is None):
        raise ConfigurationError(f"a consumer on {stream!r} takes a callback or on_chunk, and only one of them")
    if not callable(handler := callback if on_chunk is None else on_chunk):
        raise ConfigurationError(
            f"the {'callback' if on_chunk is None else 'on_chunk'} of a consumer on {stream!r} must be callable "
            f"({'message, context' if on_chunk is None else 'chunk'}), not {handler!r}")
    return handler  # type: ignore[no-any-return]
