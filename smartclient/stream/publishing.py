"""The publish path of a producer: batching, confirms, back-pressure, frame-size checks.

rstream declares the publisher and owns the connection; this module packs Publish frames itself
(one ``struct`` call per entry and one join per batch, instead of a frame object and a ``BytesIO`` per
message: :mod:`smartclient.stream.publish_frames`), writes them on rstream's connection, and tracks confirms
with a handler of its own.  By default each body goes as an AMQP 1.0 message of one data section, whose header
is packed with the entry's (``encoding="raw"``: the body alone).
A ``send()`` appends to a buffer that is flushed when it holds ``batch_size`` messages, when the
next message would not fit the negotiated frame max, or ``linger`` seconds after its first message.

Every message stays in ``_pending`` (publishing id -> its packed entry) until the broker confirms or
refuses it. When the connection is lost or the leader moves, the producer suspends the buffer (sends
queue up, nothing is written), places a new publisher, and resumes the buffer there: every pending
message is written again, in publishing-id order, before any new one. A named producer's broker
deduplicates the ones it had already stored, so each message is stored once.

Back-pressure is bounded three times (:class:`BatchingPolicy`): at most ``max_in_flight`` messages wait
for a confirm; a ``send()`` that finds no room waits at most ``enqueue_timeout`` and then raises
:class:`EnqueueTimeout` (the message was not queued); a message not confirmed ``confirm_timeout`` after
it was queued fails with ``CONFIRM_TIMEOUT`` and a reason (between 1 and 1.25 times the timeout: a timer
checks every quarter of it, against the highest publishing id queued at each tick, so the hot path pays
nothing).  While the producer recovers, the clock stops: the recovery is bounded by ``RecoveryPolicy``. """

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from itertools import accumulate, chain, repeat
from typing import Any

from smartclient._errors import ConfigurationError, EnqueueTimeout, MessageTooLarge, PublishFailed
from smartclient.core.amqp_data import SHORT
from smartclient.core.batching import CONFIRM_TIMEOUT, CONNECTION_LOST, BatchingPolicy, Confirmation
from smartclient.stream.flag import Flag
from smartclient.stream.publish_frames import (
    FRAME_OVERHEAD,
    HEADER,
    PID,
    PUBLISH_KEY,
    Encoded,
    as_part,
    entries,
    entry_size,
    entry_sizes,
    filtered_entry,
)

log = logging.getLogger(__name__)

__all__ = ["CONFIRM_TIMEOUT", "CONNECTION_LOST", "NOT_QUEUED", "QUEUED", "QUEUED_DRAIN", "BatchingPolicy",
           "Confirmation", "PublishBuffer"]

_WRITTEN_FRAMES = 4096  # frames awaiting their confirm that are timed (metrics and traces)
_WRITE_HIGH_WATER = 4 * 1024 * 1024
# PublishError codes that mean "this publisher is gone from this node", not "this message is bad":
# the message stays pending and is sent again once the producer has recovered.
_RETRIABLE = {6: "stream not available", 18: "publisher does not exist"}
# what PublishBuffer.put() did with a message
NOT_QUEUED, QUEUED, QUEUED_DRAIN = 0, 1, 2
_drain: Callable[[Iterable[Any]], None] = deque(maxlen=0).extend  # runs an iterator to its end, keeping nothing

ConfirmCallback = Callable[[Confirmation], Awaitable[None] | None]


class PublishBuffer:
    """Batches and publishes for one publisher on one connection.

    A message is kept as it came (its body, or with a filter value its packed entry) in ``_pending`` and in the
    batch being built; a Publish frame's entry headers (and, with ``encoding="amqp"``, each body's data section
    header) are packed when the frame is written, in one pass over the batch.  Confirms arrive as one array of
    ids per frame (the seam decodes them) and are settled in one pass too."""

    # (no __dict__: with this many attributes it was 1.5 KiB a producer, issue 57)
    __slots__ = ("_amqp", "_batch_size", "_bytes", "_callbacks", "_cap", "_encoded", "_error", "_expiry", "_high",
                 "_idle", "_ids", "_marks", "_overhead", "_parts", "_pending", "_seam", "_space", "_sub_batch",
                 "_sub_counts", "_suspended", "_timer", "_version", "_waiters", "_wide", "_written", "client",
                 "confirmed", "encoding", "failed", "filter_value", "frame_max", "on_confirmed", "on_lost", "policy",
                 "publisher_id", "resent", "sent", "stream", "timed_out")

    def __init__(self, client: Any, publisher_id: int, stream: str, policy: BatchingPolicy,
                 filter_value: Callable[[Any], str | None] | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 on_confirmed: Callable[[float, list[tuple[int, float, int]]], None] | None = None,
                 encoding: str = "amqp") -> None:
        self.stream = stream
        self.encoding = encoding
        self.policy = policy
        self.filter_value = filter_value
        self.on_lost = on_lost  # told when the broker says this publisher is gone (see _RETRIABLE)
        self._version = 2 if filter_value is not None else 1
        self._amqp = encoding == "amqp"  # each body in an AMQP 1.0 data section (publish_frames)
        # what the frame adds to each kept part: a version 1 part is the body alone (its entry header, and its
        # data section's header: 5 bytes under 256, else 8), a version 2 one is its entry already
        self._overhead = (entry_size(b"", self._amqp) if self._version == 1 else 0)
        self._wide = 3 if self._amqp and self._version == 1 else 0  # what a body of 256 bytes or more adds to it
        self._cap = policy.max_in_flight
        self._batch_size = policy.batch_size
        self._ids: list[int] = []
        self._parts: list[bytes] = []
        self._bytes = FRAME_OVERHEAD
        self._waiters: dict[int, asyncio.Future[Confirmation] | ConfirmCallback] = {}
        self._pending: dict[int, bytes] = {}  # publishing id -> its part, until confirmed or failed
        self._sub_counts: dict[int, int] = {}  # publishing id of a pending sub-entry -> its messages
        self._sub_batch = False  # the batch being built holds sub-entries (they go in frames of their own)
        self._encoded = False  # the batch being built holds an Encoded part (an AMQPMessage: no data section added)
        self._suspended = False
        self.resent = 0
        self.sent = 0
        self.confirmed = 0
        self.failed = 0
        self._space = Flag()
        self._idle = Flag()  # set exactly while nothing is pending
        self._timer: asyncio.TimerHandle | None = None
        self._error: BaseException | None = None
        self._callbacks: set[asyncio.Future[Any]] = set()
        self._expiry: asyncio.TimerHandle | None = None
        #: (tick time, highest publishing id queued then), with a confirm timeout (made then: a deque is 760 bytes)
        self._marks: deque[tuple[float, int]] | None = None
        self.timed_out = 0
        #: told, once per confirm frame, the time and the Publish frames it confirmed (metrics and traces)
        self.on_confirmed = on_confirmed
        # (a frame's last publishing id, written at, size): cleared on a recovery or close, bounded if confirms
        # never come (timing is lost then, never a message); made once metrics or traces want it
        self._written: deque[tuple[int, float, int]] | None = None
        self._high = -1  # the highest publishing id written so far: what is at or below it is written again
        self._bind(client, publisher_id)

    @property
    def waiting(self) -> int:
        """Callers and callbacks waiting for a confirm."""
        return len(self._waiters)

    @property
    def in_flight(self) -> int:
        """Messages queued or sent and not yet confirmed or failed."""
        return len(self._pending)

    def _bind(self, client: Any, publisher_id: int) -> None:
        from smartclient.stream import _rstream  # the seam (imports rstream: only once a producer exists)

        self._seam = _rstream
        self.client = client
        self.publisher_id = publisher_id
        self.frame_max = _rstream.frame_max_of(client)
        _rstream.on_publish_frames(client, f"smartclient-{publisher_id}", self._on_confirm, self._on_error)

    def _unbind(self) -> None:
        self._seam.off_publish_frames(self.client, f"smartclient-{self.publisher_id}")

    def _clear_batch(self) -> None:
        self._ids = []
        self._parts = []
        self._bytes = FRAME_OVERHEAD
        self._sub_batch = False
        self._encoded = False

    # -- recovery -------------------------------------------------------------------------------
    @property
    def suspended(self) -> bool:
        return self._suspended

    def suspend(self) -> None:
        """Stop writing: the connection is gone or the publisher moved.  Sends still queue (up to
        ``max_in_flight``); everything pending is written again by :meth:`resume`."""
        if not self._suspended:
            self._suspended = True
            self._unbind()

    def resume(self, client: Any, publisher_id: int) -> int:
        """Bind to a newly declared publisher and write every pending message again, in publishing-id
        order, before anything sent later.  Returns how many were written again."""
        self._bind(client, publisher_id)
        self._suspended = False
        self._clear_batch()
        self._written = None  # their confirms would time the outage; the frames written again are timed anew
        count, sent = 0, self.sent
        for pid in sorted(self._pending):  # synchronous: no send can slip in between
            part = self._pending[pid]
            sub = pid in self._sub_counts
            size = len(part) + PID.size if sub else self._size_of(part)
            if size + FRAME_OVERHEAD > self.frame_max:
                self._settle([pid], False, CONNECTION_LOST, f"it no longer fits the frame max of {self.frame_max}")
                continue
            if (self._bytes + size > self.frame_max or len(self._ids) >= self._batch_size
                    or (self._ids and sub != self._sub_batch)):
                self._write()
            self._sub_batch = sub
            self._encoded = self._encoded or type(part) is Encoded
            self._ids.append(pid)
            self._parts.append(part)
            self._bytes += size
            count += self._sub_counts[pid] if sub else 1  # messages, as `sent` counts them
        self._write()
        self.resent += count - (self.sent - sent)  # not those queued while suspended and written the first time
        return count

    def fail_all(self, reason: str, cause: BaseException | None = None) -> None:
        """Give up: every pending message fails with ``reason`` (raised ``from cause``), and so does every later
        send."""
        error = PublishFailed(f"producer on {self.stream!r} stopped: {reason}")
        error.__cause__ = cause
        self.close(reason, error, cause)

    def close(self, reason: str, error: BaseException, cause: BaseException | None = None) -> None:
        """Stop for good: every pending message fails with ``reason`` (its error raised ``from cause``); every
        later send raises ``error``."""
        self._suspended = True
        self._unbind()
        self._clear_batch()
        self._written = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._error = error
        self._settle(sorted(self._pending), False, CONNECTION_LOST, reason, cause)
        self._space.set()  # a send waiting for room wakes up and raises the error

    # -- sending --------------------------------------------------------------------------------
    def put(self, publishing_id: int, body: Any, waiter: asyncio.Future[Confirmation] | ConfirmCallback | None
            ) -> int:
        """Queue one message if that needs no wait and no check can fail: the hot path of ``send()``, no
        coroutine.  Returns ``QUEUED``, ``QUEUED_DRAIN`` (queued; await :meth:`drain`) or ``NOT_QUEUED`` (nothing
        was done: call :meth:`add`, which waits for room, makes room in the frame, or raises)."""
        pending = self._pending
        if (type(body) is not bytes or self._overhead == 0 or len(pending) >= self._cap
                or self._error is not None or self._sub_batch):
            return NOT_QUEUED
        size = len(body)
        size += self._overhead if size < SHORT else self._overhead + self._wide
        if self._bytes + size > self.frame_max:
            return NOT_QUEUED
        if waiter is not None:
            self._waiters[publishing_id] = waiter
        if not pending:
            self._idle.clear()
        pending[publishing_id] = body
        ids = self._ids
        ids.append(publishing_id)
        self._parts.append(body)
        self._bytes += size
        if len(ids) >= self._batch_size:
            self._flush()
            return QUEUED_DRAIN if self._must_drain() else QUEUED
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.policy.linger, self._flush)
        return QUEUED

    async def drain(self) -> None:
        """Wait until the socket takes more (after a flush left over ``_WRITE_HIGH_WATER`` bytes in its buffer)."""
        await self._seam.writer_of(self.client).drain()

    async def add(self, publishing_id: int, body: Any, waiter: asyncio.Future[Confirmation] | ConfirmCallback | None
                  = None) -> None:
        data = as_part(body)
        if self._version == 1:
            part = data
        else:
            value = self.filter_value(body) if self.filter_value is not None else None
            part = filtered_entry(publishing_id, value, data, self._amqp)
        if waiter is not None:  # before queueing: a flush may be followed by an await, and the confirm by it
            self._waiters[publishing_id] = waiter
        try:
            if len(self._pending) >= self._cap:
                await self._wait_for_room()
            drain = self._append(publishing_id, part, len(data))
        except BaseException:
            self._waiters.pop(publishing_id, None)
            raise
        if drain:
            await self.drain()

    async def add_many(self, first_id: int, bodies: list[bytes]) -> None:
        """Queue ``bodies`` with consecutive publishing ids from ``first_id`` (no per-message waiters): the
        same checks as :meth:`add`, a batch's worth of messages at a time where they are all ``bytes`` and fit."""
        if self._version != 1:
            for offset, body in enumerate(bodies):
                try:
                    await self.add(first_id + offset, body)
                except EnqueueTimeout as exc:
                    exc.queued = offset  # the ones before it are queued: their ids must not be given back
                    raise
            return
        done, total, pending = 0, len(bodies), self._pending
        while done < total:
            if self._error is not None:
                raise self._error
            room = self._cap - len(pending)
            if room <= 0:
                await self._wait_for_room(done)
                continue
            if self._sub_batch:  # sub-entries go in frames of their own
                self._flush()
            part = bodies[done:done + min(total - done, room, self._batch_size - len(self._ids))]
            take, drain, plain = 0, False, set(map(type, part)) == {bytes}
            if plain:
                # as many as fit the frame: the running sizes of their entries, against the room left in it
                ends = list(accumulate(entry_sizes(part, self._amqp)))
                take = bisect_right(ends, self.frame_max - self._bytes)
            if take:
                ids = range(first_id + done, first_id + done + take)
                if not pending:
                    self._idle.clear()
                pending.update(zip(ids, part[:take], strict=True))
                self._ids.extend(ids)
                self._parts.extend(part[:take])
                self._bytes += ends[take - 1]
                done += take
                if len(self._ids) >= self._batch_size or take < len(part):
                    drain = self._flush_drain()  # a full batch, or a full frame
            elif plain and self._ids:
                drain = self._flush_drain()  # the frame is full: the next pass starts a new one
            else:  # bodies of other types, or one too large for a frame: one at a time (converted, or refused)
                for body in part:
                    data = as_part(body)
                    drain = self._append(first_id + done, data, len(data)) or drain
                    done += 1
            if drain:
                await self.drain()
        if self._ids and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.policy.linger, self._flush)

    async def add_entry(self, publishing_id: int, entry: bytes, messages: int,
                        waiter: asyncio.Future[Confirmation] | ConfirmCallback | None = None) -> None:
        """Queue one sub-entry (:func:`sub_entry`) of ``messages`` messages under one publishing id: the broker
        stores it as one entry and confirms it once.  Sub-entries go in Publish frames of their own."""
        if self._version != 1:
            raise ConfigurationError(f"the producer on {self.stream!r} has a filter value: a sub-entry's messages "
                                     f"cannot carry one each")
        size = PID.size + len(entry)
        if size + FRAME_OVERHEAD > self.frame_max:  # before any wait: it would never fit
            raise MessageTooLarge(f"a sub-entry of {messages} messages ({len(entry)} bytes) for {self.stream!r} "
                                  f"does not fit the negotiated frame max of {self.frame_max} bytes")
        if waiter is not None:
            self._waiters[publishing_id] = waiter
        try:
            if len(self._pending) >= self._cap:
                await self._wait_for_room()
            if self._error is not None:
                raise self._error
            if (self._ids and not self._sub_batch) or self._bytes + size > self.frame_max:
                self._flush()
        except BaseException:
            self._waiters.pop(publishing_id, None)
            raise
        self._sub_batch = True
        if not self._pending:
            self._idle.clear()
        self._ids.append(publishing_id)
        self._parts.append(entry)
        self._pending[publishing_id] = entry
        self._sub_counts[publishing_id] = messages
        self._bytes += size
        if len(self._ids) >= self._batch_size:
            if self._flush_drain():
                await self.drain()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.policy.linger, self._flush)

    async def _wait_for_room(self, queued: int = 0) -> None:
        self._space.clear()
        self._flush()
        try:
            await asyncio.wait_for(self._space.wait(), self.policy.enqueue_timeout)
        except asyncio.TimeoutError:
            raise EnqueueTimeout(
                f"no room for a message on {self.stream!r} after {self.policy.enqueue_timeout:g} s: "
                f"{len(self._pending)} message(s) wait for a confirm (max_in_flight {self.policy.max_in_flight})"
                + ("; the producer is recovering" if self._suspended else ""), queued) from None

    def _append(self, publishing_id: int, part: bytes, body_size: int) -> bool:
        """The checks and bookkeeping of one message (no await); True if the socket should be drained."""
        size = self._size_of(part)
        if size + FRAME_OVERHEAD > self.frame_max:
            raise MessageTooLarge(
                f"a message of {body_size} bytes for {self.stream!r} does not fit the negotiated frame max of "
                f"{self.frame_max} bytes"
            )
        if self._error is not None:
            raise self._error
        if self._bytes + size > self.frame_max or self._sub_batch:
            self._flush()
        if not self._pending:
            self._idle.clear()
        if type(part) is Encoded:
            self._encoded = True
        self._ids.append(publishing_id)
        self._parts.append(part)
        self._pending[publishing_id] = part
        self._bytes += size
        if len(self._ids) >= self._batch_size:
            return self._flush_drain()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.policy.linger, self._flush)
        return False

    def _size_of(self, part: bytes) -> int:
        """What a kept part (not a sub-entry) adds to a frame."""
        return entry_size(part, self._amqp) if self._version == 1 else len(part)

    def _flush_drain(self) -> bool:
        """Write the batch; True if the socket should be drained."""
        self._flush()
        return self._must_drain()

    def _must_drain(self) -> bool:
        return not self._suspended and self._write_buffer_size() > _WRITE_HIGH_WATER

    def _write_buffer_size(self) -> int:
        try:
            return self._seam.writer_of(self.client).transport.get_write_buffer_size()
        except AttributeError:  # the connection is already closed: suspend() follows
            return 0

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._ids:
            self._write()

    def _write(self) -> None:
        ids, parts = self._ids, self._parts
        count = len(ids)
        if not count:
            return
        if self._expiry is None and self.policy.confirm_timeout:
            self._expiry = asyncio.get_running_loop().call_later(self.policy.confirm_timeout / 4, self._expire)
        if self._suspended:  # the parts stay in _pending; resume() writes them
            self._clear_batch()
            return
        header = HEADER.pack(self._bytes - 4, PUBLISH_KEY, self._version, self.publisher_id, count)
        packed: Iterable[bytes]
        if self._sub_batch:  # each sub-entry says its own size
            packed = chain.from_iterable(zip(map(PID.pack, ids), parts, strict=True))
        elif self._version == 1:
            packed = entries(ids, parts, self._amqp, self._encoded)
        else:
            packed = parts
        frame = b"".join(chain((header,), packed))
        messages = sum(map(self._sub_counts.get, ids, repeat(1))) if self._sub_batch else count
        if self.on_confirmed is not None:  # per frame, and only with metrics or traces on
            if self._written is None:
                self._written = deque(maxlen=_WRITTEN_FRAMES)
            self._written.append((ids[-1], time.monotonic(), messages))
        # ids rise within a frame and from frame to frame; only a recovery writes some again
        if ids[0] > self._high:
            self.sent += messages
        else:
            self.sent += sum(self._sub_counts.get(pid, 1) for pid in ids if pid > self._high)
        self._high = max(self._high, ids[-1])
        self._clear_batch()
        try:
            self._seam.writer_of(self.client).write(frame)
        except (AttributeError, RuntimeError, OSError) as exc:  # closed under us: recover, nothing is lost
            self._lost(f"writing to {self.stream!r} failed: {type(exc).__name__}")

    def _expire(self) -> None:
        """The confirm-timeout tick: fail what was queued a whole ``confirm_timeout`` ago and is still pending."""
        self._expiry = None
        pending = self._pending
        if not pending:
            self._marks = None
            return
        now = time.monotonic()
        timeout = self.policy.confirm_timeout
        if self._suspended:  # recovering: bounded by RecoveryPolicy; the clock starts again once it is resent
            self._marks = None
            if self._error is None:
                self._expiry = asyncio.get_running_loop().call_later(timeout / 4, self._expire)
            return
        if self._marks is None:
            self._marks = deque()
        marks = self._marks
        marks.append((now, next(reversed(pending))))
        cutoff = None
        while marks and now - marks[0][0] >= timeout:
            cutoff = marks.popleft()[1]
        if cutoff is not None:
            expired = []
            for pid in pending:  # in the order queued: the oldest first
                if pid > cutoff:
                    break
                expired.append(pid)
            if expired:
                self.timed_out += sum(self._sub_counts.get(pid, 1) for pid in expired)
                self._settle(expired, False, CONFIRM_TIMEOUT, f"not confirmed within {timeout:g} s")
        if pending and self._error is None:
            self._expiry = asyncio.get_running_loop().call_later(timeout / 4, self._expire)

    def _lost(self, reason: str) -> None:
        self.suspend()
        if self.on_lost is not None:
            self.on_lost(reason)

    async def flush(self) -> None:
        """Send what is buffered and wait until every message sent so far is confirmed (or failed)."""
        self._flush()
        await self._idle.wait()
        if self._error is not None:
            raise self._error

    # -- confirms -------------------------------------------------------------------------------
    def _on_confirm(self, frame: Any) -> None:
        if frame.publisher_id != self.publisher_id:
            return
        ids = frame.publishing_ids
        if self.on_confirmed is not None and self._written and ids:
            # the broker confirms a publisher's ids in order: its last is the highest (max() over a thousand ids
            # cost more than the metric it feeds); ends out of order, every id is looked at
            highest, written, frames = ids[-1], self._written, []
            if ids[0] > highest:
                highest = max(ids)
            while written and written[0][0] <= highest:
                frames.append(written.popleft())
            if frames:
                self.on_confirmed(time.monotonic(), frames)
        self._settle(ids, True, 1)

    def _on_error(self, frame: Any) -> None:
        if frame.publisher_id != self.publisher_id:
            return
        retry = None
        if self._written and frame.errors:  # frames that end at or below a refused id are not confirmed ones
            highest = max(error.publishing_id for error in frame.errors)
            while self._written and self._written[0][0] <= highest:
                self._written.popleft()
        for error in frame.errors:
            if error.response_code in _RETRIABLE:
                retry = _RETRIABLE[error.response_code]  # stays pending; sent again after recovery
            else:
                self._settle([error.publishing_id], False, error.response_code,
                             f"the broker refused it (code {error.response_code})")
        if retry is not None and not self._suspended:
            self._lost(f"the broker answered {retry!r}")

    def _settle(self, ids: Iterable[int], ok: bool, code: int, reason: str = "",
                cause: BaseException | None = None) -> None:
        pending = self._pending
        before = len(pending)
        _drain(map(pending.pop, ids, repeat(None)))  # one pass in C: a confirm frame's ids, or a failure's
        count = before - len(pending)
        if self._sub_counts:  # a sub-entry counts its messages
            subs = self._sub_counts
            count += sum(subs.pop(pid) - 1 for pid in ids if pid in subs)
        if ok:
            self.confirmed += count
        else:
            self.failed += count
        if self._waiters:
            for pid in ids:
                waiter = self._waiters.pop(pid, None)
                if waiter is None:
                    continue
                confirmation = Confirmation(pid, ok, code, reason)
                if isinstance(waiter, asyncio.Future):
                    if waiter.done():
                        continue
                    if ok:
                        waiter.set_result(confirmation)
                    else:
                        failed = PublishFailed(
                            f"message {pid} on {self.stream!r} failed: {reason or f'code {code}'}", confirmation)
                        failed.__cause__ = cause
                        waiter.set_exception(failed)
                else:
                    try:
                        result = waiter(confirmation)
                    except Exception:  # the application's callback: every other message still gets its answer
                        log.exception("the confirm callback of message %d on %r failed", pid, self.stream)
                        continue
                    if asyncio.iscoroutine(result):  # keep a reference until the callback has run
                        task = asyncio.ensure_future(result)
                        self._callbacks.add(task)
                        task.add_done_callback(self._callbacks.discard)
        if len(pending) < self.policy.max_in_flight:
            self._space.set()
        if not pending:
            self._idle.set()
