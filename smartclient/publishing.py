"""The publish path of a producer: batching, confirms, back-pressure, frame-size checks.

rstream declares the publisher and owns the connection; this module packs Publish frames itself
(one ``struct`` call and one join per batch, instead of a frame object and a ``BytesIO`` per
message), writes them on rstream's connection, and tracks confirms with a handler of its own.
A ``send()`` appends to a buffer that is flushed when it holds ``batch_size`` messages, when the
next message would not fit the negotiated frame max, or ``linger`` seconds after its first message.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigurationError, MessageTooLarge, PublishFailed

__all__ = ["BatchingPolicy", "Confirmation", "PublishBuffer"]

_PUBLISH_KEY = 0x0002
_HEADER = struct.Struct(">IHHBI")  # size, key, version, publisher id, message count
_ENTRY = struct.Struct(">QI")  # publishing id, message size
_ENTRY_V2 = struct.Struct(">Qh")  # publishing id, filter value size (-1: none)
_FRAME_OVERHEAD = _HEADER.size  # 13 bytes
_WRITE_HIGH_WATER = 4 * 1024 * 1024

ConfirmCallback = Callable[["Confirmation"], Awaitable[None] | None]


@dataclass(frozen=True)
class BatchingPolicy:
    """How ``send()`` batches.

    :param batch_size: messages per Publish frame, at most.
    :param linger: seconds a partial batch waits for more messages before it is sent.
    :param max_in_flight: messages sent or queued but not yet confirmed, at most: ``send()`` waits
        (back-pressure) while the producer is at this cap.
    """

    batch_size: int = 1000
    linger: float = 0.002
    max_in_flight: int = 20_000

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigurationError(f"batch_size must be a positive int, not {self.batch_size!r}")
        if not 0 <= self.linger <= 10:
            raise ConfigurationError(f"linger must be between 0 and 10 seconds, not {self.linger!r}")
        if self.max_in_flight < self.batch_size:
            raise ConfigurationError(f"max_in_flight ({self.max_in_flight}) must be at least batch_size "
                                     f"({self.batch_size})")


@dataclass(frozen=True)
class Confirmation:
    """The broker's answer for one message: confirmed, or failed with the broker's code."""

    publishing_id: int
    confirmed: bool
    code: int = 1


class PublishBuffer:
    """Batches and publishes for one publisher on one connection."""

    def __init__(self, client: Any, publisher_id: int, stream: str, policy: BatchingPolicy,
                 filter_value: Callable[[Any], str] | None = None) -> None:
        from rstream import schema

        self.client = client
        self.publisher_id = publisher_id
        self.stream = stream
        self.policy = policy
        self.filter_value = filter_value
        self.frame_max = int(client._frame_max)
        self._version = 2 if filter_value is not None else 1
        self._ids: list[int] = []
        self._parts: list[bytes] = []
        self._bytes = _FRAME_OVERHEAD
        self._waiters: dict[int, asyncio.Future[Confirmation] | ConfirmCallback] = {}
        self.in_flight = 0
        self.sent = 0
        self.confirmed = 0
        self.failed = 0
        self._space = asyncio.Event()
        self._space.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._timer: asyncio.TimerHandle | None = None
        self._error: BaseException | None = None
        self._callbacks: set[asyncio.Future[Any]] = set()
        name = f"smartclient-{publisher_id}"
        client.add_handler(schema.PublishConfirm, self._on_confirm, name=name)
        client.add_handler(schema.PublishError, self._on_error, name=name)

    # -- sending --------------------------------------------------------------------------------
    async def add(self, publishing_id: int, body: Any, waiter: asyncio.Future[Confirmation] | ConfirmCallback | None
                  = None) -> None:
        data = body if type(body) is bytes else bytes(body)
        if self._version == 1:
            entry = _ENTRY.pack(publishing_id, len(data)) + data
        else:
            value = self.filter_value(body) if self.filter_value is not None else None
            encoded = value.encode() if value is not None else b""
            entry = (_ENTRY_V2.pack(publishing_id, len(encoded) if value is not None else -1) + encoded
                     + len(data).to_bytes(4, "big") + data)
        if waiter is not None:  # before queueing: a flush may be followed by an await, and the confirm by it
            self._waiters[publishing_id] = waiter
        try:
            if self.in_flight >= self.policy.max_in_flight:
                await self._wait_for_room()
            drain = self._append(publishing_id, entry, len(data))
        except BaseException:
            self._waiters.pop(publishing_id, None)
            raise
        if drain:
            await self.client._conn._writer.drain()
        self._idle.clear()
        if self._ids and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.policy.linger, self._flush)

    async def add_many(self, first_id: int, bodies: list[bytes]) -> None:
        """Queue ``bodies`` with consecutive publishing ids from ``first_id`` (no per-message waiters):
        the same checks as :meth:`add`, in one loop, without packing a frame object per message."""
        if self._version != 1:
            for offset, body in enumerate(bodies):
                await self.add(first_id + offset, body)
            return
        pack = _ENTRY.pack
        cap = self.policy.max_in_flight
        for pid, body in enumerate(bodies, first_id):
            data = body if type(body) is bytes else bytes(body)
            if self.in_flight >= cap:
                await self._wait_for_room()
            if self._append(pid, pack(pid, len(data)) + data, len(data)):
                await self.client._conn._writer.drain()
        self._idle.clear()
        if self._ids and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.policy.linger, self._flush)

    async def _wait_for_room(self) -> None:
        self._space.clear()
        self._flush()
        await self._space.wait()

    def _append(self, publishing_id: int, entry: bytes, body_size: int) -> bool:
        """The checks and bookkeeping of one message (no await); True if the socket should be drained."""
        size = len(entry)
        if size + _FRAME_OVERHEAD > self.frame_max:
            raise MessageTooLarge(
                f"a message of {body_size} bytes for {self.stream!r} does not fit the negotiated frame max of "
                f"{self.frame_max} bytes"
            )
        if self._error is not None:
            raise self._error
        if self._bytes + size > self.frame_max:
            self._flush()
        self._ids.append(publishing_id)
        self._parts.append(entry)
        self._bytes += size
        self.in_flight += 1
        if len(self._ids) >= self.policy.batch_size:
            self._flush()
            return bool(self.client._conn._writer.transport.get_write_buffer_size() > _WRITE_HIGH_WATER)
        return False

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._ids:
            return
        count = len(self._ids)
        header = _HEADER.pack(self._bytes - 4, _PUBLISH_KEY, self._version, self.publisher_id, count)
        frame = header + b"".join(self._parts)
        self._ids = []
        self._parts = []
        self._bytes = _FRAME_OVERHEAD
        self.sent += count
        self.client._conn._writer.write(frame)

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
        self._settle(ids, True, 1)

    def _on_error(self, frame: Any) -> None:
        if frame.publisher_id != self.publisher_id:
            return
        for error in frame.errors:
            self._settle([error.publishing_id], False, error.response_code)

    def _settle(self, ids: list[int], ok: bool, code: int) -> None:
        count = len(ids)
        self.in_flight -= count
        if ok:
            self.confirmed += count
        else:
            self.failed += count
        if self._waiters:
            for pid in ids:
                waiter = self._waiters.pop(pid, None)
                if waiter is None:
                    continue
                confirmation = Confirmation(pid, ok, code)
                if isinstance(waiter, asyncio.Future):
                    if waiter.done():
                        continue
                    if ok:
                        waiter.set_result(confirmation)
                    else:
                        waiter.set_exception(PublishFailed(
                            f"the broker refused message {pid} on {self.stream!r} (code {code})", confirmation))
                else:
                    result = waiter(confirmation)
                    if asyncio.iscoroutine(result):  # keep a reference until the callback has run
                        task = asyncio.ensure_future(result)
                        self._callbacks.add(task)
                        task.add_done_callback(self._callbacks.discard)
        if self.in_flight < self.policy.max_in_flight:
            self._space.set()
        if self.in_flight <= 0:
            self._idle.set()
