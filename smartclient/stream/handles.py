"""The producer and consumer handles an Environment returns: thin wrappers over rstream's."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    EnqueueTimeout,
    HandleClosed,
    PublishFailed,
    SmartClientError,
    StreamNotFound,
)
from smartclient.core.address import Address
from smartclient.core.deadline import attempt, detach
from smartclient.core.filters import StreamFilter
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.publishing_ids import PublishingIds
from smartclient.core.topology import Role
from smartclient.stream.publishing import BatchingPolicy, Confirmation, ConfirmCallback, PublishBuffer
from smartclient.stream.unreported import confirm_leader, watch_confirms, watch_deliveries

if TYPE_CHECKING:
    from smartclient.stream.host import PlacementRecord, StreamHost

__all__ = ["Consumer", "Producer", "RecoveryAttempt"]

log = logging.getLogger(__name__)
CLOSE_TIMEOUT = 10.0  # seconds Producer.close() waits for the confirms of what was sent, by default


@dataclass(frozen=True)
class RecoveryAttempt:
    """One recovery attempt: how long it took, how it ended, its steps (``name ms outcome``, each bounded)."""

    number: int
    seconds: float
    outcome: str
    steps: str


class _Handle:
    """What producers and consumers share: placement, and recovery after a loss (see RecoveryPolicy)."""

    role: Role

    def __init__(self, host: StreamHost, carrier: Any, stream: str, name: str | None) -> None:
        self._host = host
        self._carrier = carrier
        self.stream = stream
        self.name = name
        self.closed = False
        self.recoveries = 0  # completed recoveries
        self.failure: str | None = None  # why recovery gave up, if it did
        self._losses = 0
        self._ready = False
        self._recovery: asyncio.Task[None] | None = None
        self._verify: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None  # its stall or delivery watch (smartclient.stream.unreported)
        self.recovery_attempts: list[RecoveryAttempt] = []  # the last 50, newest last

    def _check_open(self) -> None:
        if self.closed:
            raise HandleClosed(f"{self!r} is closed" + (f" ({self.failure})" if self.failure else ""))

    async def _end(self, reason: str) -> None:
        """Close quietly because the Environment itself ended the stream (it deleted it): no recovery."""
        self.failure = reason
        await self._close(flush=False)

    async def close(self) -> None:
        """Stop; calling it again does nothing.  A producer first waits (up to 10 s) for the confirms of
        what it sent; every message still pending then ends failed with a reason."""
        await self._close(flush=True)

    async def _close(self, flush: bool) -> None:
        raise NotImplementedError

    @property
    def recovering(self) -> bool:
        return self._recovery is not None and not self._recovery.done()

    def _lost(self, reason: str) -> None:
        """The connection, the publisher or the subscription is gone (rstream or the broker said so)."""
        if self.closed or self.failure is not None:
            return
        self._losses += 1
        self._suspend()
        if self._ready and not self.recovering:
            self._recovery = asyncio.get_running_loop().create_task(
                self._recover(reason), name=f"smartclient-recover-{self.role.value}-{self.stream}")

    def _setup_done(self) -> None:
        self._ready = True
        if self._losses:  # lost while it was being placed
            self._losses -= 1
            self._lost("lost while it was being placed")

    def _suspend(self) -> None:
        pass

    async def _reattach(self) -> str:
        """One recovery attempt; returns what it did, for the log."""
        raise NotImplementedError

    def _give_up(self, reason: str) -> None:
        self.failure = reason
        log.error("%r stopped: %s", self, reason)

    async def _recover(self, reason: str) -> None:
        detach()  # started from a connection's reader, whose context holds the deadline of an old attempt
        policy = self._host.recovery
        started = time.monotonic()
        attempts = 0
        log.warning("%r lost (%s): recovering", self, reason)
        if not policy.enabled:
            self._give_up(f"lost ({reason}) and recovery is disabled")
            return
        self._host.recovering(self.role, self.stream, True, self)
        try:
            while not self.closed:
                seen = self._losses
                attempts += 1
                self._host.drop_topology(self.stream)
                authentication = False
                began = time.monotonic()
                with attempt(policy.attempt_time, f"recovery attempt {attempts} of {self!r}") as deadline:
                    try:
                        done = await self._reattach()
                    except StreamNotFound as exc:
                        self._note_attempt(attempts, began, f"StreamNotFound: {exc}", deadline.log())
                        self._give_up(str(exc))
                        return
                    except (AuthenticationFailed, CertificateRejected) as exc:  # retrying would repeat it
                        last: BaseException = exc
                        authentication = True
                    except Exception as exc:  # any other failure of one attempt is retried, within the policy
                        last = exc
                    else:
                        if self._losses == seen:
                            self.recoveries += 1
                            self._note_attempt(attempts, began, "recovered", deadline.log())
                            log.warning("%r recovered after %d attempt(s) in %.2f s: %s (steps: %s)", self, attempts,
                                        time.monotonic() - started, done, deadline.log())
                            if self.role is Role.PRODUCER and "Metadata Update" in reason:
                                self._verify = asyncio.get_running_loop().create_task(confirm_leader(self, self._host))
                            return
                        last = SmartClientError("lost again while recovering")
                self._note_attempt(attempts, began, f"{type(last).__name__}: {last}", deadline.log())
                elapsed = time.monotonic() - started
                delay = policy.next_delay(attempts, elapsed, authentication=authentication)
                if delay is None:
                    self._give_up(f"recovery gave up after {attempts} attempt(s) in {elapsed:.1f} s: "
                                  f"{type(last).__name__}: {last}")
                    return
                log.info("%r: recovery attempt %d failed after %.2f s (%s: %s; steps: %s); next in %.2f s", self,
                         attempts, time.monotonic() - began, type(last).__name__, last, deadline.log(), delay)
                await asyncio.sleep(delay)
        finally:
            self._host.recovering(self.role, self.stream, False, self)

    def _note_attempt(self, number: int, began: float, outcome: str, steps: str) -> None:
        self.recovery_attempts.append(RecoveryAttempt(number, time.monotonic() - began, outcome, steps))
        del self.recovery_attempts[:-50]

    async def _stop_recovery(self) -> None:
        for task in (self._verify, self._watch):
            if task is not None:
                task.cancel()  # (a no-op once it is done)
        task = self._recovery
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def placement(self) -> PlacementRecord | None:
        """Where this producer or consumer sits now (it changes if it recovers onto another node)."""
        return self._host.placement_of(self._carrier, self.stream)

    @property
    def node(self) -> Address | None:
        return record.node if (record := self.placement) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(stream={self.stream!r}, name={self.name!r}, node={self.node})"


class Producer(_Handle):
    """Publishes to one stream from the node that hosts its leader.

    Every message ends confirmed, or failed with a reason.  When the connection is lost or the leader moves,
    the producer places a new publisher on the (new) leader and sends every unconfirmed message again, in
    order, before any later one (:class:`RecoveryPolicy`); ``send()`` queues meanwhile (``max_in_flight``).

    A *named* producer deduplicates: on start it reads the last publishing id the broker stored for its
    name (:attr:`last_publishing_id`), then every message carries a publishing id, given or assigned, so
    the messages sent again after a recovery are stored once. Ids must increase: an id not above the
    highest one this producer has sent raises :class:`PublishingIdNotIncreasing` before the broker can
    confirm-and-drop it; ids up to :attr:`last_publishing_id` may be sent again after a restart (filtered).
    """

    role = Role.PRODUCER
    _closing = False
    _buffer: PublishBuffer
    _ids: PublishingIds  # the core decides every publishing id

    @property
    def last_publishing_id(self) -> int | None:
        """For a named producer: the highest publishing id the broker had stored for its name when it started.
        ``0`` means that nothing was stored, or that the stored id was 0: the protocol answers 0 for both, which
        is why automatically numbered ids start at 1.  ``None`` for an unnamed producer (no stored sequence)."""
        return self._ids.stored if self.name else None

    async def _place(self, batching: BatchingPolicy, filter_value: Callable[[Any], str] | None) -> None:
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        # rstream creates its publisher lazily, on the first send; create it now so that placement
        # (and any placement error) happens here.  Publishing itself goes through PublishBuffer.
        self._ids = PublishingIds(self.stream, self.name)
        with map_stream_errors(f"declaring a producer on {self.stream!r}"):
            client, publisher_id = await _rstream.declare_publisher(self._carrier, self.stream, self.name)
            if self.name:
                self._ids.stored = await _rstream.stored_sequence(client, self.stream, self.name)
        self._buffer = PublishBuffer(client, publisher_id, self.stream, batching, filter_value, on_lost=self._lost,
                                     on_confirmed=self._host.confirm_watch(self.stream))
        self._setup_done()
        if (every := self._host.recovery.stall_check) and self._host.recovery.enabled:
            self._watch = asyncio.get_running_loop().create_task(watch_confirms(self, self._host, every))

    @property
    def buffer(self) -> PublishBuffer | None:
        return getattr(self, "_buffer", None)

    def _suspend(self) -> None:
        if hasattr(self, "_buffer"):
            self._buffer.suspend()

    async def _reattach(self) -> str:
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        await _rstream.close_publisher(self._carrier, self.stream)  # the broker may still hold it (PublishError 6)
        with map_stream_errors(f"recovering the producer on {self.stream!r}"):
            client, publisher_id = await _rstream.declare_publisher(self._carrier, self.stream, self.name)
        resent = self._buffer.resume(client, publisher_id)
        return f"{resent} unconfirmed message(s) sent again"

    def _give_up(self, reason: str) -> None:
        super()._give_up(reason)
        self._buffer.fail_all(reason)

    async def send(self, body: bytes | Any, *, publishing_id: int | None = None,
                   on_confirm: ConfirmCallback | None = None) -> None:
        """Queue one message: it is batched, and ``on_confirm`` (if given) gets its :class:`Confirmation`.

        Waits only when the producer has ``max_in_flight`` unconfirmed messages (back-pressure).

        :raises MessageTooLarge: the message cannot fit the negotiated frame max; nothing was sent.
        :raises PublishingIdNotIncreasing: a named producer was given an id not above its last one.
        :raises EnqueueTimeout: no room within ``enqueue_timeout``: not queued, and its id may be used again.
        :raises HandleClosed: the producer was closed.
        """
        if self.closed:
            self._check_open()
        first = self._ids.take(publishing_id)
        try:  # (inline, not through _queue: one coroutine less per message)
            await self._buffer.add(first, body, on_confirm)
        except EnqueueTimeout:
            self._ids.give_back(first)
            raise

    async def _queue(self, first: int, body: Any, waiter: Any, many: bool = False) -> None:
        try:
            await (self._buffer.add_many(first, body) if many else self._buffer.add(first, body, waiter))
        except EnqueueTimeout as exc:  # not queued: the ids go back (a retry with the same ids works)
            self._ids.give_back(first + exc.queued)
            raise

    async def send_many(self, bodies: Sequence[bytes], *, first_publishing_id: int | None = None) -> None:
        """Queue several messages with consecutive publishing ids (from ``first_publishing_id``, or the next
        ones); the fastest way to publish a list.  Same checks and back-pressure as :meth:`send`."""
        self._check_open()
        if not bodies:
            return
        await self._queue(self._ids.take(first_publishing_id, len(bodies)), list(bodies), None, many=True)

    async def submit(self, body: bytes | Any, *, publishing_id: int | None = None) -> asyncio.Future[Confirmation]:
        """Queue one message and return a future of its :class:`Confirmation` (``PublishFailed`` if refused)."""
        self._check_open()
        future: asyncio.Future[Confirmation] = asyncio.get_running_loop().create_future()
        await self._queue(self._ids.take(publishing_id), body, future)
        return future

    async def send_wait(self, body: bytes | Any, *, publishing_id: int | None = None) -> Confirmation:
        """Send one message now and wait for its confirm (``PublishFailed`` if refused or failed)."""
        self._check_open()
        future = await self.submit(body, publishing_id=publishing_id)
        self._buffer._flush()
        return await future

    async def send_batch(self, bodies: Sequence[bytes | Any]) -> list[Confirmation]:
        """Send several messages and wait for all their confirms (named producers number them in order).
        :raises ConfigurationError: an empty batch."""
        self._check_open()
        if not bodies:
            raise ConfigurationError(f"empty batch for {self.stream!r}: nothing to send")
        futures = [await self.submit(body) for body in bodies]
        self._buffer._flush()
        return list(await asyncio.gather(*futures))

    async def flush(self) -> None:
        """Send what is buffered and wait until every message sent so far is confirmed (or failed)."""
        self._check_open()
        await self._buffer.flush()

    async def _close(self, flush: bool, timeout: float = CLOSE_TIMEOUT) -> None:
        from smartclient.stream import _rstream

        if self.closed or self._closing:
            return
        self._closing = True
        try:
            buffer = getattr(self, "_buffer", None)
            if flush and buffer is not None and buffer.in_flight and (self.recovering or not buffer.suspended):
                with contextlib.suppress(asyncio.TimeoutError, PublishFailed):  # each waiter got its answer
                    await asyncio.wait_for(buffer.flush(), timeout)  # what send() queued goes out first
        finally:  # even if close() itself is cancelled: the handle ends closed, its messages answered
            self.closed = True
            await asyncio.shield(self._teardown(_rstream.close_publisher))

    async def _teardown(self, close: Callable[[Any, str], Awaitable[None]]) -> None:
        reason = self.failure or "the producer was closed before they were confirmed"
        try:
            await self._stop_recovery()
            buffer = getattr(self, "_buffer", None)
            if buffer is not None:
                buffer.close(reason, HandleClosed(f"{self!r} is closed ({reason})"))
            with attempt(5.0, f"closing {self!r}"):
                await close(self._carrier, self.stream)
        finally:
            self._host.release(self)


class Consumer(_Handle):
    """Reads one stream from a node that hosts a replica (or the leader, as the fallback).

    A *named* consumer can store its offset (:meth:`store_offset`, or :class:`OffsetTracking`) and be one of
    a group of *single active* consumers: one instance of the name receives at a time; when it goes away
    another takes over where the consumer-update handler says (by default: after the last stored offset).

    Lost, or when the stream's members change, it subscribes again, on another member if need be, after
    the last message it handed to the callback: no gap, and with tracking or single active consumer (where
    that offset is known per message) no duplicate; without either, after the last whole chunk delivered.
    """

    role = Role.CONSUMER
    _closing = False
    subscription_id: int | None = None
    active: bool | None = None  # for a single active consumer: whether this instance receives now
    _untracked = False
    _last_offset: int | None = None
    redelivered = 0  # messages at or below the last offset handed over, handed over again (counted, logged)
    _subscriber: Any = None  # rstream's subscriber (its offset is the next one after the last chunk)
    _start: int | None = None  # an absolute start (delivery watch)

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
    def handing_over(self) -> bool:  # a chunk waits for, or is in, the callback
        from smartclient.stream._rstream import busy
        return self._subscriber is not None and (busy(self._subscriber) or self.queued_chunks > 0)

    @property
    def queued_chunks(self) -> int:
        """Chunks received and waiting for the callback: at most the flow's ``initial_credit`` (ConsumerFlow)."""
        from smartclient.stream import _rstream

        return _rstream.queued_chunks(self._subscriber) if self._subscriber is not None else 0

    async def _subscribe(
        self,
        callback: Callable[[Any, Any], Awaitable[None] | None],
        offset: OffsetSpec,
        *,
        single_active: bool = False,
        on_update: Callable[[bool, Consumer], Awaitable[OffsetSpec] | OffsetSpec] | None = None,
        tracking: OffsetTracking | None = None,
        super_stream: str | None = None,
        stream_filter: StreamFilter | None = None,
    ) -> None:
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        self.offset = offset
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
                if on_update is not None:
                    chosen = on_update(is_active, self)
                    spec = await chosen if inspect.isawaitable(chosen) else chosen
                    self._last_offset = None  # the application chose where to resume, maybe earlier
                else:
                    spec = await self._resume_point() if is_active else OffsetSpec.next()
                self._start = (parsed := OffsetSpec.parse(spec)).start  # where it resumes (the delivery watch)
                return _rstream.consumer_update_answer(parsed)

            listener = consumer_update

        tracked = tracking is not None
        every = tracking.every if tracking is not None else None

        def after(context: Any) -> None:
            self.last_offset = context.offset
            if tracked:
                self._since_store += 1
                if every is not None and self._since_store >= every and self._storing is None:
                    self._storing = asyncio.ensure_future(self._auto_store())
                    self._storing.add_done_callback(lambda _: setattr(self, "_storing", None))

        deliver: Callable[[Any, Any], Any]
        if not tracked and not single_active:
            deliver = callback  # nothing to do per message: rstream calls the application directly
            self._untracked = True
        elif inspect.iscoroutinefunction(callback):
            async def deliver_async(message: Any, context: Any) -> Any:
                last = self._last_offset
                if last is not None and context.offset <= last:  # handed over already: counted, not hidden
                    return await self._again(context.offset, last, callback(message, context))
                await callback(message, context)
                after(context)

            deliver = deliver_async
        else:
            # a plain callback gets a plain wrapper: no coroutine per message on the hot path
            def deliver_sync(message: Any, context: Any) -> Any:
                last = self._last_offset
                if last is not None and context.offset <= last:  # handed over already: counted, not hidden
                    return self._again(context.offset, last, callback(message, context))
                result = callback(message, context)
                after(context)
                return result  # a callable object may still return an awaitable; rstream awaits it

            deliver = deliver_sync

        self._how: dict[str, Any] = dict(
            subscriber_name=self.name, properties=properties, consumer_update_listener=listener,
            filter_input=_rstream.filter_config(stream_filter) if stream_filter is not None else None,
        )
        self._deliver = deliver
        with map_stream_errors(f"subscribing to {self.stream!r}"):
            await self._subscribe_at(offset)
        if tracking is not None and tracking.interval is not None:
            self._tracker = asyncio.create_task(self._track_by_time(tracking.interval))
        self._setup_done()
        if (look := self._host.recovery.stall_check) and self._host.recovery.enabled and stream_filter is None:
            self._watch = asyncio.get_running_loop().create_task(watch_deliveries(self, self._host, look))

    async def _subscribe_at(self, offset: OffsetSpec) -> None:
        from smartclient.stream import _rstream

        how = dict(self._how)
        if how["properties"] is not None:
            how["properties"] = dict(how["properties"])  # rstream adds the filter keys to it
        self.subscription_id, self._subscriber = await _rstream.subscribe(
            self._carrier, self.stream, self._deliver, offset, **how)
        self._start = offset.start

    async def _reattach(self) -> str:
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        await _rstream.close_subscriber(self._carrier, self.stream)  # stops delivery first: last_offset is final
        self._last_offset = self.last_offset
        self._subscriber = None
        resume = OffsetSpec.at(self._last_offset + 1) if self._last_offset is not None else self.offset
        with map_stream_errors(f"recovering the consumer on {self.stream!r}"):
            await self._subscribe_at(resume)
        return f"subscribed again from {resume} (subscription {self.subscription_id})"

    def _again(self, offset: int, last: int, result: Any) -> Any:  # a repeat: handed over, counted, said
        self.redelivered += 1
        if self.redelivered % 1000 == 1:
            log.warning("%r got offset %d again (had up to %d): %d repeats", self, offset, last, self.redelivered)
        return result

    async def _resume_point(self) -> OffsetSpec:
        """Where a single active consumer starts when it becomes active: after the stored offset, or
        after its own last message if that is further (it was active before a recovery)."""
        stored = await self.stored_offset()
        after = [value + 1 for value in (stored, self._last_offset) if value is not None]
        return OffsetSpec.at(max(after)) if after else self.offset

    async def _track_by_time(self, interval: float) -> None:
        while not self.closed:
            await asyncio.sleep(interval / 4)
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
        with map_stream_errors(f"storing the offset of {self.name!r} on {self.stream!r}"):
            await _rstream.store_offset(self._carrier, self.stream, self.name, value)
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
            self._host.release(self)
