"""Super streams: partitioned streams, each partition placed like any stream.

A :class:`SuperStreamProducer` holds one producer per partition, each on its partition's leader,
and routes every message either by the Java-compatible hash of its key or by the broker's bindings
(the Route command).  A :class:`SuperStreamConsumer` holds one consumer per partition; with a name
and ``single_active``, the broker keeps exactly one active consumer per partition across all
instances of the name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from smartclient._errors import ConfigurationError, HandleClosed, TopologyError
from smartclient.core.routing import hash_partition
from smartclient.stream.admin import partition_names

if TYPE_CHECKING:
    from smartclient.options import ConsumerOptions, ProducerOptions
    from smartclient.stream.consumer import Consumer
    from smartclient.stream.handles import Producer
    from smartclient.stream.host import StreamOpener
    from smartclient.stream.publishing import Confirmation, ConfirmCallback

T = TypeVar("T")

__all__ = ["SuperStreamConsumer", "SuperStreamProducer", "opened", "partition_names"]

S = TypeVar("S", "SuperStreamProducer", "SuperStreamConsumer")


async def opened(handle: S, *args: Any) -> S:
    """``handle`` with every partition's producer (or consumer) open; on any failure, what opened is closed."""
    try:
        await handle._open(*args)
    except BaseException:
        await handle.close()
        raise
    return handle

ROUTINGS = ("hash", "key")


async def _all_of(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Await every one of them, even when one fails (no result is left unretrieved); then raise the first
    failure, or return the results in order."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast("list[T]", results)


class SuperStreamProducer:
    """Publishes to a super stream: routes each message to a partition, whose producer sits on its leader.

    The publishing surface is :class:`Producer`'s (``send``, ``send_many``, ``submit``, ``send_wait``,
    ``send_batch``, ``flush``, ``close``), each call routed by the message's key: ``key=`` if given, else
    the producer's key function.  With ``routing="key"``, the broker's bindings may send one message to
    several partitions; then the message is confirmed when every copy is, and ``on_confirm`` is told once
    per copy.  After :meth:`close`, every method raises :class:`HandleClosed` at once.
    """

    def __init__(self, env: StreamOpener, super_stream: str, partitions: list[str], routing: str,
                 key: Callable[[Any], str] | None, options: ProducerOptions) -> None:
        if routing not in ROUTINGS:
            raise ConfigurationError(f"routing {routing!r} must be one of {ROUTINGS}")
        self.env = env
        self.super_stream = super_stream
        self.partitions = partitions
        self.routing = routing
        self.key = key
        self.options = options  #: every partition's producer's (the same name on each)
        self.name = options.name
        self.encoding = options.encoding  #: "amqp" or "raw", for every partition (see Environment.producer)
        self.producers: dict[str, Producer] = {}
        self.closed = False
        self._routes: dict[str, list[str]] = {}

    def __repr__(self) -> str:
        return f"SuperStreamProducer(super_stream={self.super_stream!r}, name={self.name!r})"

    def _check_open(self) -> None:
        if self.closed:
            raise HandleClosed(f"{self!r} is closed")

    async def _open(self) -> None:
        for partition in self.partitions:
            self.producers[partition] = producer = await self.env.producer(partition, self.options)
            producer.super_stream = self.super_stream  # (telemetry: its partitions, together)

    async def route(self, body: Any, key: str | None = None) -> list[str]:
        """The partitions a message goes to (one for hash routing; those bound to the key for key routing).

        :raises ConfigurationError: no key (neither ``key=`` nor a key function), or a key that is not a str.
        :raises TopologyError: key routing, and no partition is bound to the key.
        :raises HandleClosed: the producer was closed.
        """
        self._check_open()
        if key is None:
            if self.key is None:
                raise ConfigurationError(f"no routing key for a message to {self.super_stream!r}: pass key= "
                                         f"or give the producer a key function")
            key = self.key(body)
        if not isinstance(key, str):
            raise ConfigurationError(f"routing key {key!r} must be a str")
        if self.routing == "hash":
            return [hash_partition(key, self.partitions)]
        if key not in self._routes:
            self._routes[key] = await self.env.route(self.super_stream, key)
        if not self._routes[key]:
            raise TopologyError(f"no partition of {self.super_stream!r} is bound to routing key {key!r}")
        return self._routes[key]

    async def send(self, body: Any, *, key: str | None = None, publishing_id: int | None = None,
                   on_confirm: ConfirmCallback | None = None) -> list[str]:
        """Queue one message on its partition(s) (see :meth:`Producer.send`); return the partitions.

        ``on_confirm`` (if given) gets the :class:`Confirmation` of each copy.

        :raises ConfigurationError: no routing key, or a bad publishing id.
        :raises TopologyError: key routing, and no partition is bound to the key.
        :raises MessageTooLarge: the message cannot fit the negotiated frame max; nothing was sent.
        :raises HandleClosed: the producer was closed.
        """
        targets = await self.route(body, key)
        for partition in targets:
            await self.producers[partition].send(body, publishing_id=publishing_id, on_confirm=on_confirm)
        return targets

    async def send_many(self, bodies: Sequence[Any], *, key: str | None = None,
                        first_publishing_id: int | None = None) -> None:
        """Queue several messages, each on its partition(s), in order within each partition.

        Each message is routed by ``key`` if given (the same for all), else by the key function.  With
        ``first_publishing_id``, message ``i`` carries id ``first_publishing_id + i`` (so each partition
        sees increasing ids); without, each partition's producer numbers its own.  Same checks and
        back-pressure as :meth:`Producer.send_many`.

        :raises ConfigurationError: no routing key, or a bad publishing id.
        :raises TopologyError: key routing, and no partition is bound to a key.
        :raises HandleClosed: the producer was closed.
        """
        self._check_open()
        by_partition: dict[str, list[tuple[int | None, Any]]] = {}
        for index, body in enumerate(bodies):
            publishing_id = None if first_publishing_id is None else first_publishing_id + index
            for partition in await self.route(body, key):
                by_partition.setdefault(partition, []).append((publishing_id, body))
        for partition, items in by_partition.items():
            producer = self.producers[partition]
            if first_publishing_id is None:
                await producer.send_many([body for _, body in items])
            else:
                for publishing_id, body in items:
                    await producer.send(body, publishing_id=publishing_id)

    async def submit(self, body: Any, *, key: str | None = None,
                     publishing_id: int | None = None) -> asyncio.Future[Confirmation]:
        """Queue one message and return a future of its :class:`Confirmation` (``PublishFailed`` if refused).

        For a message routed to several partitions, the future ends when every copy has: with the first
        copy's Confirmation, or the first failure.

        :raises ConfigurationError: no routing key, or a bad publishing id.
        :raises TopologyError: key routing, and no partition is bound to the key.
        :raises HandleClosed: the producer was closed.
        """
        targets = await self.route(body, key)
        futures = [await self.producers[p].submit(body, publishing_id=publishing_id) for p in targets]
        if len(futures) == 1:
            return futures[0]

        async def every_copy() -> Confirmation:
            return (await _all_of(futures))[0]

        return asyncio.ensure_future(every_copy())

    async def send_wait(self, body: Any, *, key: str | None = None, publishing_id: int | None = None) -> list[str]:
        """Send one message now and wait until every copy is confirmed; return the partitions it went to.

        :raises PublishFailed: the broker refused a copy, or it failed.
        :raises ConfigurationError: no routing key, or a bad publishing id.
        :raises TopologyError: key routing, and no partition is bound to the key.
        :raises HandleClosed: the producer was closed.
        """
        targets = await self.route(body, key)
        await _all_of([self.producers[p].send_wait(body, publishing_id=publishing_id) for p in targets])
        return targets

    async def send_batch(self, bodies: Sequence[Any], *, key: str | None = None) -> list[Confirmation]:
        """Send several messages and wait for all their confirms: one :class:`Confirmation` per message, in
        order (for a message sent to several partitions, its first copy's, once every copy is confirmed).

        :raises ConfigurationError: an empty batch, or no routing key.
        :raises TopologyError: key routing, and no partition is bound to a key.
        :raises PublishFailed: the broker refused a message, or it failed.
        :raises HandleClosed: the producer was closed.
        """
        self._check_open()
        if not bodies:
            raise ConfigurationError(f"empty batch for {self.super_stream!r}: nothing to send")
        routes = [await self.route(body, key) for body in bodies]
        by_partition: dict[str, list[int]] = {}
        for index, targets in enumerate(routes):
            for partition in targets:
                by_partition.setdefault(partition, []).append(index)
        partitions = list(by_partition)
        batches = await _all_of([self.producers[p].send_batch([bodies[i] for i in by_partition[p]])
                                 for p in partitions])
        confirmations: dict[int, Confirmation] = {}
        for partition, batch in zip(partitions, batches, strict=True):
            for index, confirmation in zip(by_partition[partition], batch, strict=True):
                confirmations.setdefault(index, confirmation)
        return [confirmations[index] for index in range(len(bodies))]

    async def flush(self) -> None:
        """Send what is buffered on every partition and wait until every message sent so far is confirmed
        (or failed).

        :raises PublishFailed: a partition's producer failed.
        :raises HandleClosed: the producer was closed.
        """
        self._check_open()
        await _all_of([producer.flush() for producer in self.producers.values()])

    async def close(self) -> None:
        """Close every partition's producer (each waits for the confirms of what it sent, see
        :meth:`Producer.close`); calling it again does nothing."""
        if self.closed:
            return
        self.closed = True
        await _all_of([producer.close() for producer in self.producers.values()])


class SuperStreamConsumer:
    """Consumes every partition of a super stream; with ``single_active``, one active consumer per
    partition across all instances sharing the name."""

    def __init__(self, env: StreamOpener, super_stream: str, partitions: list[str]) -> None:
        self.env = env
        self.super_stream = super_stream
        self.partitions = partitions
        self.consumers: dict[str, Consumer] = {}
        self.closed = False

    def __repr__(self) -> str:
        return f"SuperStreamConsumer(super_stream={self.super_stream!r})"

    async def _open(self, callback: Callable[[Any, Any], Awaitable[None] | None] | None,
                    on_chunk: Callable[[Any], Any] | None, options: ConsumerOptions) -> None:
        for partition in self.partitions:
            self.consumers[partition] = await self.env.consumer(
                partition, callback, on_chunk=on_chunk, options=options,
                super_stream=self.super_stream if options.single_active else None,
            )
            self.consumers[partition].super_stream = self.super_stream  # (telemetry: its partitions, together)

    @property
    def callback_errors(self) -> int:
        """Messages (or chunks) of every partition whose callback raised and that ``on_error`` skipped."""
        return sum(c.callback_errors for c in self.consumers.values())

    @property
    def failures(self) -> dict[str, Any]:
        """Partition -> why its consumer stopped on its own (e.g. :class:`CallbackFailed`), for those that did."""
        return {p: c.failure for p, c in self.consumers.items() if c.failure is not None}

    @property
    def active_partitions(self) -> list[str]:
        return [p for p, c in self.consumers.items() if c.active]

    async def close(self) -> None:
        """Close every partition's consumer; calling it again does nothing."""
        if self.closed:
            return
        self.closed = True
        await _all_of([c.close() for c in self.consumers.values()])
