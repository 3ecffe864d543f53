"""The producer handle an Environment returns, and what it shares with the consumer handle (placement and
recovery after a loss): thin wrappers over rstream's.  The consumer is in :mod:`smartclient.stream.consumer`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from smartclient import credentials
from smartclient._errors import (
    ConfigurationError,
    EnqueueTimeout,
    HandleClosed,
    HandleStopped,
    PublishFailed,
    RecoveryFailed,
    SmartClientError,
    StepTimeout,
    StreamNotFound,
)
from smartclient.core.address import Address
from smartclient.core.deadline import TOPOLOGY_READ, attempt, detach
from smartclient.core.publishing_ids import PublishingIds
from smartclient.core.recovery import AttemptNow, Recovery, RecoveryEvent, Stop
from smartclient.core.topology import Role
from smartclient.stream.publish_frames import Records, sub_entry
from smartclient.stream.publishing import (
    QUEUED,
    QUEUED_DRAIN,
    BatchingPolicy,
    Confirmation,
    ConfirmCallback,
    PublishBuffer,
)
from smartclient.stream.unreported import ConfirmWatch, Watch, confirm_leader, watch

if TYPE_CHECKING:
    from smartclient.options import ProducerOptions
    from smartclient.stream.host import HandleControl, PlacementRecord, StreamHost

__all__ = ["Producer", "RecoveryAttempt", "open_handle"]

log = logging.getLogger(__name__)
H = TypeVar("H", bound="_Handle")
CLOSE_TIMEOUT = 10.0  # seconds Producer.close() waits for the confirms of what was sent, by default


@dataclass(frozen=True)
class RecoveryAttempt:
    """One recovery attempt: how long it took, how it ended, its steps (``name ms outcome``, each bounded)."""

    number: int
    seconds: float
    outcome: str
    steps: str


async def open_handle(handle: H, seconds: float, opening: Callable[[], Awaitable[Any]]) -> H:
    """Place ``handle`` (a Producer or a Consumer) within ``seconds``: ``opening`` is what places it (declaring the
    publisher, subscribing); on any failure, or a cancellation, nothing of it stays behind in rstream."""
    try:
        with attempt(seconds, f"placing {handle!r}") as deadline:
            await opening()
        log.debug("%r placed: %s", handle, deadline.log())
    except BaseException:
        await asyncio.shield(handle._close(flush=False))
        raise
    return handle


class _Control:
    """A handle's :class:`~smartclient.stream.host.HandleControl`: what the machinery may ask of it."""

    __slots__ = ("_handle",)

    def __init__(self, handle: _Handle) -> None:
        self._handle = handle

    @property
    def carrier(self) -> Any:
        return self._handle._carrier

    @property
    def subscriber(self) -> Any:
        return self._handle._subscriber_now()

    def lost(self, reason: str) -> None:
        self._handle._lost(reason)

    async def end(self, reason: str) -> None:
        await self._handle._end(reason)


class _Handle:
    """What producers and consumers share: placement, and recovery after a loss (see RecoveryPolicy)."""

    role: Role
    __slots__ = ("__weakref__", "_carrier", "_host", "_losses", "_ready", "_recovery", "_verify", "_watch", "closed",
                 "control", "failure", "name", "recoveries", "recovery_attempts", "stream", "super_stream")

    def __init__(self, host: StreamHost, carrier: Any, stream: str, name: str | None) -> None:
        self._host = host
        self._carrier = carrier
        self.stream = stream
        self.name = name
        self.super_stream: str | None = None  # the super stream whose partition its stream is, if opened as one
        self.closed = False
        self.recoveries = 0  # completed recoveries
        #: why it stopped on its own, if it did: RecoveryFailed (recovery gave up), CallbackFailed (a consumer's
        #: callback raised and on_error said stop), HandleStopped (the Environment deleted its stream)
        self.failure: HandleStopped | None = None
        self._losses = 0
        self._ready = False
        self._recovery: asyncio.Task[None] | None = None
        self._verify: asyncio.Task[None] | None = None
        self._watch: Watch | None = None  # its stall or delivery watch (smartclient.stream.unreported)
        self.recovery_attempts: list[RecoveryAttempt] = []  # the last 50, newest last
        self.control: HandleControl = _Control(self)  # what the machinery may ask of it (stream/host.py)

    def _subscriber_now(self) -> Any:
        return None

    def _check_open(self) -> None:
        if self.closed:
            raise HandleClosed(f"{self!r} is closed" + (f" ({self.failure})" if self.failure else ""))

    async def _end(self, reason: str) -> None:
        """Close quietly because the Environment itself ended the stream (it deleted it): no recovery."""
        self.failure = HandleStopped(reason)
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

    def _give_up(self, failure: RecoveryFailed) -> None:
        self.failure = failure
        log.error("%r stopped: %s", self, failure)

    async def _recover(self, reason: str) -> None:
        """Drive the core's recovery plan (:class:`~smartclient.core.recovery.Recovery`): reattach, within one
        attempt's time each, until it holds or the plan stops; the host is told how it ended."""
        detach()  # started from a connection's reader, whose context holds the deadline of an old attempt
        credentials.acting_alone()  # not asked by the application: no dial with a login the broker refused
        policy = self._host.recovery
        recovery, before = Recovery(policy), self.node
        log.warning("%r lost (%s): recovering", self, reason)
        step = recovery.start(reason)
        if isinstance(step, AttemptNow):
            self._host.recovering(self.role, self.stream, True, self)
        progressed = False
        try:
            while isinstance(step, AttemptNow) and not self.closed:
                if step.delay:
                    await asyncio.sleep(step.delay)
                seen = self._losses
                if not progressed:  # (after one that did, the topology it read just now is kept)
                    self._host.drop_topology(self.stream)
                began = time.monotonic()
                with attempt(policy.attempt_time, f"recovery attempt {recovery.attempts} of {self!r}") as deadline:
                    try:
                        done = await self._reattach()
                    except Exception as exc:  # each failure is the plan's to judge (a refusal ends it at once)
                        last: BaseException = exc
                    else:
                        if self._losses == seen:
                            self.recoveries += 1
                            self._note_attempt(recovery.attempts, began, "recovered", deadline.log())
                            log.warning("%r recovered after %d attempt(s) in %.2f s: %s (steps: %s)", self,
                                        recovery.attempts, recovery.seconds, done, deadline.log())
                            self._follow(self._after_recovery(reason))
                            return
                        last = SmartClientError("lost again while recovering")
                self._note_attempt(recovery.attempts, began, f"{type(last).__name__}: {last}", deadline.log())
                progressed = isinstance(last, StepTimeout) and deadline.got_past(TOPOLOGY_READ)
                step = recovery.failed(last, progressed=progressed)
                if isinstance(step, AttemptNow):
                    log.info("%r: recovery attempt %d failed after %.2f s (%s: %s; steps: %s); next in %.2f s", self,
                             recovery.attempts - 1, time.monotonic() - began, type(last).__name__, last,
                             deadline.log(), step.delay)
            if isinstance(step, Stop):
                if isinstance(recovery.last, StreamNotFound):
                    self._host.forget_when_unused(self.stream)  # deleted elsewhere: with its last handle
                self._give_up(step.failure)
        finally:
            if recovery.attempts:
                self._host.recovering(self.role, self.stream, False, self)
            after = self.node if self.failure is None and not self.closed else None
            self._host.recovered(RecoveryEvent(self, "stream", before, after, reason, recovery.seconds,
                                               recovery.attempts, self.failure))

    def _after_recovery(self, reason: str) -> Coroutine[Any, Any, None] | None:
        """What looks after this handle once it recovered from ``reason`` (:mod:`~smartclient.stream.unreported`)."""
        return None

    def _follow(self, looks: Coroutine[Any, Any, None] | None) -> None:
        """Run ``looks`` in place of the last recovery's."""
        if self._verify is not None:
            self._verify.cancel()
        self._verify = asyncio.get_running_loop().create_task(looks) if looks is not None else None

    def _note_attempt(self, number: int, began: float, outcome: str, steps: str) -> None:
        self.recovery_attempts.append(RecoveryAttempt(number, time.monotonic() - began, outcome, steps))
        del self.recovery_attempts[:-50]

    async def _stop_recovery(self) -> None:
        for task in (self._verify, self._watch):
            if task is not None:
                task.cancel()  # (a no-op once it is done or over)
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

    A ``bytes`` body goes as an AMQP 1.0 message of one data section (:attr:`encoding` ``"amqp"``, the default),
    which every client of the stream reads; with ``"raw"``, as the bytes alone, which only stream clients read.
    An ``AMQPMessage`` goes as it encodes itself.  See docs/streams.md, "What is on the wire".
    """

    role = Role.PRODUCER
    encoding = "amqp"  #: how a body goes on the wire: "amqp" (one AMQP 1.0 data section) or "raw"
    _closing = False
    _buffer: PublishBuffer
    _ids: PublishingIds  # the core decides every publishing id

    @property
    def last_publishing_id(self) -> int | None:
        """For a named producer: the highest publishing id the broker had stored for its name when it started.
        ``0`` means that nothing was stored, or that the stored id was 0: the protocol answers 0 for both, which
        is why automatically numbered ids start at 1.  ``None`` for an unnamed producer (no stored sequence)."""
        return self._ids.stored if self.name else None

    async def _place(self, options: ProducerOptions, batching: BatchingPolicy) -> None:
        """Declare the publisher on the leader (and, named, read its stored sequence): the producer's placement."""
        from smartclient.stream import _rstream
        from smartclient.stream._rstream import map_stream_errors

        # rstream creates its publisher lazily, on the first send; create it now so that placement
        # (and any placement error) happens here.  Publishing itself goes through PublishBuffer.
        self._ids = PublishingIds(self.stream, self.name)
        self.encoding = encoding = options.encoding
        with map_stream_errors(f"declaring a producer on {self.stream!r}"):
            client, publisher_id = await _rstream.declare_publisher(self._carrier, self.stream, self.name)
            if name := self.name:  # (it asks the writer: on a connection of its own)
                self._ids.stored = await self._host.aside(
                    self.stream, "the publishing id query", lambda other: _rstream.stored_sequence(other, self.stream,
                                                                                                    name))
        self._buffer = PublishBuffer(client, publisher_id, self.stream, batching, options.filter_value,
                                     on_lost=self._lost, on_confirmed=self._host.confirm_watch(self.stream),
                                     encoding=encoding)
        self._setup_done()
        if self._host.recovery.stall_check and self._host.recovery.enabled:
            self._watch = watch(self, self._host, ConfirmWatch)

    @property
    def buffer(self) -> PublishBuffer | None:
        return getattr(self, "_buffer", None)

    def _after_recovery(self, reason: str) -> Coroutine[Any, Any, None] | None:
        return confirm_leader(self, self._host) if "Metadata Update" in reason else None

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

    def _give_up(self, failure: RecoveryFailed) -> None:
        super()._give_up(failure)
        self._buffer.fail_all(str(failure), failure)

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
        buffer = self._buffer
        queued = buffer.put(first, body, on_confirm)  # the hot path: no coroutine below this one
        if queued == QUEUED:
            return
        if queued == QUEUED_DRAIN:
            await buffer.drain()
            return
        try:
            await buffer.add(first, body, on_confirm)
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

    async def send_sub_entry(self, bodies: Sequence[bytes | Any] | Records, *, publishing_id: int | None = None,
                             compression: str = "none", on_confirm: ConfirmCallback | None = None) -> None:
        """Queue ``bodies`` as one sub-entry: the broker stores them as one entry, with one publishing id
        (deduplicated, confirmed and failed as a whole: ``on_confirm`` gets one :class:`Confirmation`), and hands
        them to every consumer as separate messages with consecutive offsets.  The broker's work per message
        drops with the sub-entry's size.  ``bodies`` may be :class:`~smartclient.stream.publish_frames.Records`,
        encoded already (a column of them, as the Spark writers send).  Uncompressed ("none"), AMQP 0.9.1 and
        1.0 consumers of the stream read them too; "gzip" only stream clients (smartclient's, rstream, Java, Go,
        .NET).

        :raises ConfigurationError: no bodies or more than 65,535, an unknown compression, or a producer with a
            filter value (a sub-entry's messages cannot carry one each).
        :raises MessageTooLarge: the sub-entry does not fit the negotiated frame max.
        :raises PublishingIdNotIncreasing: a named producer was given an id not above its last one.
        :raises EnqueueTimeout: no room within ``enqueue_timeout``: not queued.
        """
        self._check_open()
        given = bodies if isinstance(bodies, Records) else list(bodies)
        entry = sub_entry(given, compression, self.encoding)  # bad input fails here, before an id is taken
        first = self._ids.take(publishing_id)
        try:
            await self._buffer.add_entry(first, entry, given.count if isinstance(given, Records) else len(given),
                                         on_confirm)
        except (EnqueueTimeout, ConfigurationError):
            self._ids.give_back(first)
            raise

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
        reason = str(self.failure or "the producer was closed before they were confirmed")
        try:
            await self._stop_recovery()
            buffer = getattr(self, "_buffer", None)
            if buffer is not None:
                buffer.close(reason, HandleClosed(f"{self!r} is closed ({reason})"))
            with attempt(5.0, f"closing {self!r}"):
                await close(self._carrier, self.stream)
        finally:
            self._host.release(self)

