"""The producer and consumer handles an Environment returns: thin wrappers over rstream's."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError, PublishingIdNotIncreasing
from .address import Address
from .offsets import OffsetSpec
from .stream_errors import map_stream_errors
from .topology import Role

if TYPE_CHECKING:
    from .environment import Environment, PlacementRecord

__all__ = ["Consumer", "Producer"]


class _Handle:
    role: Role

    def __init__(self, env: Environment, carrier: Any, stream: str, name: str | None) -> None:
        self.env = env
        self._carrier = carrier
        self.stream = stream
        self.name = name
        self.closed = False

    @property
    def placement(self) -> PlacementRecord | None:
        """Where this producer or consumer sits now (it changes if it recovers onto another node)."""
        return self.env.placement_of(self._carrier._pool, self.stream)

    @property
    def node(self) -> Address | None:
        record = self.placement
        return record.node if record else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(stream={self.stream!r}, name={self.name!r}, node={self.node})"


class Producer(_Handle):
    """Publishes to one stream from the node that hosts its leader.

    A *named* producer deduplicates: on start it reads the last publishing id the broker stored for
    its name (:attr:`last_publishing_id`), then every message carries a publishing id, given or
    assigned.  Ids must increase: an id not above the highest one this producer has sent raises
    :class:`PublishingIdNotIncreasing` before the broker can confirm-and-drop it.  Ids up to
    :attr:`last_publishing_id` may be sent again after a restart (the broker filters and confirms them).
    """

    role = Role.PRODUCER
    last_publishing_id: int = 0  # for a named producer: what the broker had stored when it started
    _highest_sent: int | None = None

    async def _place(self) -> None:
        # rstream creates its publisher lazily, on the first send; create it now so that placement
        # (and any placement error) happens here.
        with map_stream_errors(f"declaring a producer on {self.stream!r}"):
            publisher = await self._carrier._get_or_create_publisher(self.stream, publisher_name=self.name)
            if self.name:
                self.last_publishing_id = await publisher.client.query_publisher_sequence(self.stream, self.name)

    def _message(self, body: Any, publishing_id: int | None) -> Any:
        from rstream import RawMessage

        if self.name is None:
            if publishing_id is not None:
                raise ConfigurationError(
                    f"publishing id {publishing_id} given to an unnamed producer on {self.stream!r}: "
                    f"deduplication needs a producer name"
                )
            return body
        if publishing_id is None:
            publishing_id = max(self.last_publishing_id, self._highest_sent or 0) + 1
        elif isinstance(publishing_id, bool) or not isinstance(publishing_id, int) or publishing_id < 0:
            raise ConfigurationError(f"publishing id {publishing_id!r} must be a non-negative int")
        elif self._highest_sent is not None and publishing_id <= self._highest_sent:
            raise PublishingIdNotIncreasing(
                f"publishing id {publishing_id} of producer {self.name!r} on {self.stream!r} is not greater than "
                f"{self._highest_sent}, the highest it sent: the broker would confirm it and drop it"
            )
        self._highest_sent = publishing_id
        if isinstance(body, bytes | bytearray | memoryview):
            return RawMessage(bytes(body), publishing_id=publishing_id)
        body.publishing_id = publishing_id
        return body

    async def send(self, body: bytes | Any, *, publishing_id: int | None = None,
                   on_confirm: Callable[[Any], Awaitable[None] | None] | None = None) -> None:
        """Queue one message; it is batched and confirmed in the background (``on_confirm`` per message).

        :raises PublishingIdNotIncreasing: a named producer was given an id not above its last one.
        """
        message = self._message(body, publishing_id)
        with map_stream_errors(f"publishing to {self.stream!r}"):
            await self._carrier.send(self.stream, message, publisher_name=self.name, on_publish_confirm=on_confirm)

    async def send_wait(self, body: bytes | Any, *, publishing_id: int | None = None) -> None:
        """Send one message and wait for the broker's confirm."""
        message = self._message(body, publishing_id)
        with map_stream_errors(f"publishing to {self.stream!r}"):
            await self._carrier.send_wait(self.stream, message, publisher_name=self.name)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            with map_stream_errors(f"closing the producer on {self.stream!r}"):
                await self._carrier._publish_buffered_messages(self.stream)  # flush what send() queued
                await self._carrier.clean_up_publishers(self.stream)
                # rstream's own restart task (started by a MetadataUpdate, e.g. the stream was deleted) may
                # drop the entry between rstream's membership check and its `del`: nothing is left to do then.
                with contextlib.suppress(KeyError):
                    await self._carrier._remove_stream_from_client(self.stream)
        finally:
            self.env._release(self.role, self._carrier, self.stream)
            self.env._forget(self)


class Consumer(_Handle):
    """Reads one stream from a node that hosts a replica (or the leader, as the fallback)."""

    role = Role.CONSUMER
    subscription_id: int | None = None

    async def _subscribe(self, callback: Callable[[Any, Any], Awaitable[None] | None], offset: OffsetSpec) -> None:
        self.offset = offset
        with map_stream_errors(f"subscribing to {self.stream!r}"):
            self.subscription_id = await self._carrier.subscribe(
                self.stream, callback, offset_specification=offset.to_rstream(), subscriber_name=self.name
            )

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.subscription_id is not None and self.subscription_id in self._carrier._subscribers:
            try:
                with map_stream_errors(f"closing the consumer on {self.stream!r}"):
                    await self._carrier.unsubscribe(self.subscription_id)
            except Exception:
                self._carrier._subscribers.pop(self.subscription_id, None)
                raise
            finally:
                self.env._release(self.role, self._carrier, self.stream)
                self.env._forget(self)
        else:  # rstream already dropped it (its stream was deleted)
            self.env._release(self.role, self._carrier, self.stream)
            self.env._forget(self)
