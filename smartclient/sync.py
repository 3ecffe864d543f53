"""The sync facade: :class:`SyncEnvironment`, :class:`SyncProducer`, :class:`SyncConsumer`.

For services that are not asyncio (Flask, Django, scripts, threads).  Like httpx's ``Client`` beside
``AsyncClient``, the names are the async ones and the errors are the same exceptions; every call blocks
until done.  One background event loop per :class:`SyncEnvironment` runs the async
:class:`~smartclient.Environment`; calls from any number of threads are handed to it, so the facade is
safe to share between threads.

Consumer callbacks run on that loop's thread: keep them short, or hand the work to a queue.

    with SyncEnvironment("rabbitmq-stream://guest:guest@lb:5552", resolver=LoadBalancer("lb:5552")) as env:
        env.create_stream("orders", exists_ok=True)
        producer = env.producer("orders", name="orders-writer")
        producer.send_wait(b"hello")
        env.consumer("orders", lambda message, context: print(bytes(message)), offset="first")
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from smartclient._errors import ConnectionFailed
from smartclient.core.batching import BatchingPolicy
from smartclient.core.delivery import Chunk
from smartclient.core.filters import StreamFilter
from smartclient.core.flow import ConsumerFlow
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.topology import StreamTopology
from smartclient.environment import Environment
from smartclient.options import ConsumerOptions, OnError, ProducerOptions
from smartclient.stream.consumer import Consumer
from smartclient.stream.handles import Producer
from smartclient.stream.host import PlacementRecord
from smartclient.stream.publishing import Confirmation
from smartclient.stream.super_stream import SuperStreamConsumer, SuperStreamProducer
from smartclient.stream.wing import StreamWing

__all__ = ["SyncConsumer", "SyncEnvironment", "SyncProducer", "SyncStreams", "SyncSuperStreamConsumer",
           "SyncSuperStreamProducer"]

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread; ``run`` blocks the caller until a coroutine is done there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="smartclient-sync-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a sync smartclient call from inside a callback would wait for itself: "
                               "hand the work to another thread")
        if self.loop.is_closed():
            coroutine.close()
            raise ConnectionFailed("this SyncEnvironment is closed")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()


class _SyncHandle:
    """What the blocking handles share: attributes are the async object's, its coroutine methods are run to
    completion on the facade's loop; close blocks."""

    aio: Producer | Consumer | SuperStreamProducer | SuperStreamConsumer

    def __init__(self, loop: _Loop) -> None:
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return _blocking(self._loop, name, getattr(self.aio, name))

    def __repr__(self) -> str:
        return f"Sync{self.aio!r}"

    def close(self) -> None:
        self._loop.run(self.aio.close())

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncProducer(_SyncHandle):
    """A :class:`~smartclient.Producer` whose calls block.  Attributes (``node``, ``stream``, ``name``,
    ``placement``, ...) are the async producer's."""

    def __init__(self, loop: _Loop, producer: Producer) -> None:
        super().__init__(loop)
        self.aio: Producer = producer

    def send(self, body: bytes | Any, *, publishing_id: int | None = None) -> None:
        """Queue one message (returns when it is queued; see :meth:`flush`, :meth:`send_wait`)."""
        self._loop.run(self.aio.send(body, publishing_id=publishing_id))

    def send_many(self, bodies: Sequence[bytes], *, first_publishing_id: int | None = None) -> None:
        self._loop.run(self.aio.send_many(bodies, first_publishing_id=first_publishing_id))

    def send_wait(self, body: bytes | Any, *, publishing_id: int | None = None) -> Confirmation:
        """Send one message and wait for its confirmation."""
        return self._loop.run(self.aio.send_wait(body, publishing_id=publishing_id))

    def send_batch(self, bodies: Sequence[bytes | Any]) -> list[Confirmation]:
        return self._loop.run(self.aio.send_batch(bodies))

    def flush(self) -> None:
        self._loop.run(self.aio.flush())


class SyncConsumer(_SyncHandle):
    """A :class:`~smartclient.Consumer` whose calls block; its callback runs on the facade's loop thread."""

    def __init__(self, loop: _Loop, consumer: Consumer) -> None:
        super().__init__(loop)
        self.aio: Consumer = consumer

    def store_offset(self, offset: int | None = None) -> None:
        self._loop.run(self.aio.store_offset(offset))

    def stored_offset(self) -> int | None:
        return self._loop.run(self.aio.stored_offset())


class SyncStreams:
    """The stream wing, its coroutine methods run to completion on the facade's loop (``env.streams``)."""

    def __init__(self, loop: _Loop, wing: StreamWing) -> None:
        self._loop, self.aio = loop, wing

    def __getattr__(self, name: str) -> Any:
        return _blocking(self._loop, name, getattr(self.aio, name))


def _blocking(loop: _Loop, name: str, attribute: Any) -> Any:
    """``attribute`` itself, or for a coroutine method, a function that runs it to completion on ``loop``."""
    if not asyncio.iscoroutinefunction(attribute):
        return attribute

    def blocking(*args: Any, **kwargs: Any) -> Any:
        return loop.run(attribute(*args, **kwargs))

    blocking.__name__ = name
    blocking.__doc__ = attribute.__doc__
    return blocking


class SyncSuperStreamProducer(_SyncHandle):
    """A :class:`~smartclient.stream.super_stream.SuperStreamProducer` whose calls (``send``, ``send_many``,
    ``send_wait``, ``send_batch``, ``flush``, ``route``) block."""

    def __init__(self, loop: _Loop, producer: SuperStreamProducer) -> None:
        super().__init__(loop)
        self.aio: SuperStreamProducer = producer


class SyncSuperStreamConsumer(_SyncHandle):
    """A :class:`~smartclient.stream.super_stream.SuperStreamConsumer`; its callback runs on the loop thread."""

    def __init__(self, loop: _Loop, consumer: SuperStreamConsumer) -> None:
        super().__init__(loop)
        self.aio: SuperStreamConsumer = consumer


class SyncEnvironment:
    """:class:`~smartclient.Environment` with blocking calls; the same arguments (see its documentation).

    Use it as ``with SyncEnvironment(...) as env:`` or call :meth:`close`.  Methods not written out here
    (``create_super_stream``, ``partitions``, ``route``, ``command_versions``, ...) are the async ones run
    to completion; the sync ones (``amqp_connection``, ``mqtt_client``, ``placements``...) are passed
    through.
    """

    def __init__(self, entry_points: Any, **settings: Any) -> None:
        self._loop = _Loop()

        async def build() -> Environment:
            env = Environment(entry_points, **settings)
            await env.start()
            return env

        try:
            self.aio: Environment = self._loop.run(build())
        except BaseException:
            self._loop.stop()
            raise

    def __repr__(self) -> str:
        return f"Sync{self.aio!r}"

    def __enter__(self) -> SyncEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return _blocking(self._loop, name, getattr(self.aio, name))

    def close(self) -> None:
        """Close every producer, consumer and connection, then stop the loop thread."""
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self.aio.close())
        finally:
            self._loop.stop()

    # -- the common calls, typed ------------------------------------------------------------------
    @property
    def streams(self) -> SyncStreams:
        """The stream wing (:attr:`Environment.streams <smartclient.Environment.streams>`), its calls blocking."""
        return SyncStreams(self._loop, self.aio.streams)

    def producer(self, stream: str, *, options: ProducerOptions | None = None, name: str | None = None,
                 filter_value: Callable[[Any], str | None] | None = None, batching: BatchingPolicy | None = None,
                 encoding: str = "amqp") -> SyncProducer:
        """See :meth:`Environment.producer <smartclient.Environment.producer>`."""
        return SyncProducer(self._loop, self._loop.run(self.aio.producer(
            stream, options=options, name=name, filter_value=filter_value, batching=batching, encoding=encoding)))

    def consumer(self, stream: str, callback: Callable[[Any, Any], Awaitable[None] | None] | None = None, *,
                 on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
                 options: ConsumerOptions | None = None, offset: OffsetSpec | str | int | datetime.datetime = "next",
                 name: str | None = None, single_active: bool = False,
                 on_update: Callable[[bool, Consumer], Awaitable[OffsetSpec] | OffsetSpec] | None = None,
                 tracking: OffsetTracking | None = None, filter: StreamFilter | None = None,
                 flow: ConsumerFlow | None = None, on_error: OnError = "stop") -> SyncConsumer:
        """See :meth:`Environment.consumer <smartclient.Environment.consumer>`; ``callback`` (or ``on_chunk``)
        runs on the facade's loop thread."""
        return SyncConsumer(self._loop, self._loop.run(self.aio.consumer(
            stream, callback, on_chunk=on_chunk, options=options, offset=offset, name=name,
            single_active=single_active, on_update=on_update, tracking=tracking, filter=filter, flow=flow,
            on_error=on_error)))

    def iter_arrow(self, stream: str, start: int = 0, end: int | None = None, *, filter: StreamFilter | None = None,
                   settle: float = 1.0, fail_on_data_loss: bool = True, decode: bool = False) -> Iterator[Any]:
        """See :meth:`Environment.iter_arrow <smartclient.Environment.iter_arrow>`: the batches, each read on the
        facade's loop thread as the iteration asks for it (the arguments are checked at once)."""
        batches = self.aio.iter_arrow(stream, start, end, filter=filter, settle=settle,
                                      fail_on_data_loss=fail_on_data_loss, decode=decode)

        async def step() -> Any:
            return await anext(batches)

        async def close() -> None:
            await batches.aclose()  # type: ignore[attr-defined]  # (an async generator's)

        def iterate() -> Iterator[Any]:
            try:
                while True:
                    try:
                        yield self._loop.run(step())
                    except StopAsyncIteration:
                        return
            finally:
                self._loop.run(close())

        return iterate()

    def super_stream_producer(self, super_stream: str, *, routing: str = "hash",
                              key: Callable[[Any], str] | None = None, options: ProducerOptions | None = None,
                              name: str | None = None, encoding: str = "amqp") -> SyncSuperStreamProducer:
        """See :meth:`Environment.super_stream_producer <smartclient.Environment.super_stream_producer>`."""
        handle = self._loop.run(self.aio.super_stream_producer(super_stream, routing=routing, key=key,
                                                               options=options, name=name, encoding=encoding))
        return SyncSuperStreamProducer(self._loop, handle)

    def super_stream_consumer(self, super_stream: str,
                              callback: Callable[[Any, Any], Awaitable[None] | None] | None = None, *,
                              on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
                              options: ConsumerOptions | None = None,
                              offset: OffsetSpec | str | int | datetime.datetime = "next", name: str | None = None,
                              single_active: bool = False, flow: ConsumerFlow | None = None
                              ) -> SyncSuperStreamConsumer:
        """See :meth:`Environment.super_stream_consumer <smartclient.Environment.super_stream_consumer>`;
        ``callback`` (or ``on_chunk``) runs on the facade's loop thread."""
        handle = self._loop.run(self.aio.super_stream_consumer(
            super_stream, callback, on_chunk=on_chunk, options=options, offset=offset, name=name,
            single_active=single_active, flow=flow))
        return SyncSuperStreamConsumer(self._loop, handle)

    def create_stream(self, stream: str, arguments: Any = None, exists_ok: bool = False) -> None:
        self._loop.run(self.aio.create_stream(stream, arguments, exists_ok=exists_ok))

    def delete_stream(self, stream: str, missing_ok: bool = False) -> None:
        self._loop.run(self.aio.delete_stream(stream, missing_ok=missing_ok))

    def topology(self, stream: str) -> StreamTopology:
        return self._loop.run(self.aio.topology(stream))

    def stream_stats(self, stream: str) -> dict[str, int]:
        return self._loop.run(self.aio.stream_stats(stream))

    def placements(self) -> list[PlacementRecord]:
        return self.aio.placements()

    def resources(self) -> dict[str, int]:
        """See :meth:`StreamWing.resources <smartclient.stream.wing.StreamWing.resources>` (read on the loop thread)."""

        async def read() -> dict[str, int]:
            return self.aio.streams.resources()
        return self._loop.run(read())
