"""A subscription's chunks on their way to its callback, with a task only while some wait.

rstream gives every subscription an ``asyncio.Queue`` of Deliver frames and a task that waits on it for the
subscription's whole life (``Client.run_queue_listener_task``): about 3 KiB a subscription (tracemalloc), most
of a single active consumer's cost when it is not the active one and is handed nothing.  :class:`Chunks`, in its
place in the client's ``_frames`` table, keeps a list, and hands its frames over from a task that starts when a
frame comes and ends once none waits (the same name in the client's ``_tasks``, so rstream's
``stop_queue_listener_task`` stops it as it stopped rstream's).  One task at a time per subscription, in order,
as before; frames that come before the handler is set wait for it, as they waited in rstream's queue; the handler
runs in the context of the code that subscribed, as rstream's task did.  rstream's reader puts every Deliver
frame in the queue of every subscription of its connection, and the handler dropped those of others: here they
are not kept (and :func:`~smartclient.stream._rstream.placed.queued_chunks` counts a subscription's own).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref
from typing import Any

__all__ = ["ChunkTable", "Chunks", "LeanDeliveries"]

log = logging.getLogger("rstream.client")  # (rstream's: what it logged of a handler that raised, it still does)


class Chunks:
    """One subscription's Deliver frames waiting for its handler: what rstream's reader and its
    ``stop_queue_listener_task`` ask of an ``asyncio.Queue`` (``put``, ``empty``, ``get_nowait``, ``qsize``)."""

    __slots__ = ("client", "context", "frames", "handler", "sid", "task")

    def __init__(self, client: weakref.ref[Any], sid: int) -> None:
        self.client, self.sid = client, sid  # (weakly: a client its own table referred to was freed only by a
        # full collection, with its socket and TLS buffers; issue 32's test_tls checks that none is)
        self.frames: list[Any] = []  # (a list: at most the subscription's credit waits here)
        self.handler: Any = None  # set by run_queue_listener_task, cleared when its delivery stops
        self.context = contextvars.Context()  # the subscriber's once it listens: its handler runs there (as before)
        self.task: asyncio.Task[None] | None = None

    async def put(self, frame: Any) -> None:
        self.put_nowait(frame)

    def put_nowait(self, frame: Any) -> None:
        # rstream's reader puts every Deliver frame in every subscription's queue of its connection (the handler
        # dropped the others': with 200 subscriptions, 199 wake-ups a chunk); only this subscription's are kept
        if getattr(frame, "subscription_id", self.sid) == self.sid:
            self.frames.append(frame)
            self.wake()

    def empty(self) -> bool:
        return not self.frames

    def qsize(self) -> int:
        return len(self.frames)

    def get_nowait(self) -> Any:
        if not self.frames:
            raise asyncio.QueueEmpty
        return self.frames.pop(0)

    def listen(self, handler: Any) -> None:
        self.handler, self.context = handler, contextvars.copy_context()
        self.wake()

    def wake(self) -> None:
        """Start handing over, if frames wait, a handler is set, and nothing hands over now (a task cancelled
        before its first step never ran its ``finally``: done counts as none)."""
        if (self.task is None or self.task.done()) and self.handler is not None and self.frames and (
                client := self.client()) is not None:
            name = f"run_delivery_handlers_{self.sid}"
            task = self.context.run(asyncio.get_running_loop().create_task, self.hand_over(name))
            self.task = client._tasks[name] = task

    async def hand_over(self, name: str) -> None:
        client = self.client()
        if client is None:
            return
        try:
            while self.frames and self.handler is not None and client.is_connection_alive():
                frame = self.frames.pop(0)
                try:
                    maybe_coro = self.handler(frame)
                    if maybe_coro is not None:
                        await maybe_coro
                except Exception as exc:  # rstream's own words
                    log.exception("Error while handling %s frame exception raised %s", frame.__class__, exc)
        finally:
            if client._tasks.get(name) is self.task:  # (not when rstream's stop_task took it out to cancel it)
                del client._tasks[name]
            self.task = None


class ChunkTable(dict[int, Chunks]):
    """The client's ``_frames``: subscription id -> its :class:`Chunks`, made on first use (rstream's was a
    ``defaultdict(asyncio.Queue)``)."""

    __slots__ = ("client",)

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = weakref.ref(client)  # (one for all its subscriptions)

    def __missing__(self, sid: int) -> Chunks:
        chunks = self[sid] = Chunks(self.client, sid)
        return chunks


class LeanDeliveries:
    """Mixed into rstream's ``Client`` (before it): its delivery tables and tasks as above."""

    _frames: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._frames = ChunkTable(self)

    async def run_queue_listener_task(self, subscriber_id: int, handler: Any) -> None:
        self._frames[subscriber_id].listen(handler)

    async def stop_queue_listener_task(self, subscriber_id: int) -> None:
        """rstream's: its handing over stops (the frame in hand is cancelled: callers wait for it first), and
        what waits is dropped; nothing more is handed over until it listens again."""
        chunks = self._frames.get(subscriber_id)
        if chunks is not None:
            chunks.handler = None
        await super().stop_queue_listener_task(subscriber_id)  # type: ignore[misc]
