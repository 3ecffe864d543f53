"""The producer and consumer handles an Environment returns: thin wrappers over rstream's."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from .address import Address
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
    """Publishes to one stream from the node that hosts its leader."""

    role = Role.PRODUCER

    async def _place(self) -> None:
        # rstream creates its publisher lazily, on the first send; create it now so that placement
        # (and any placement error) happens here.
        with map_stream_errors(f"declaring a producer on {self.stream!r}"):
            await self._carrier._get_or_create_publisher(self.stream, publisher_name=self.name)

    async def send(self, body: bytes | Any) -> None:
        """Queue one message; it is batched and confirmed in the background."""
        with map_stream_errors(f"publishing to {self.stream!r}"):
            await self._carrier.send(self.stream, body, publisher_name=self.name)

    async def send_wait(self, body: bytes | Any) -> None:
        """Send one message and wait for the broker's confirm."""
        with map_stream_errors(f"publishing to {self.stream!r}"):
            await self._carrier.send_wait(self.stream, body, publisher_name=self.name)

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

    async def _subscribe(self, callback: Callable[[Any, Any], Awaitable[None] | None], offset: str | int) -> None:
        from rstream import ConsumerOffsetSpecification, OffsetType

        kinds = {"first": OffsetType.FIRST, "last": OffsetType.LAST, "next": OffsetType.NEXT}
        if isinstance(offset, bool) or not isinstance(offset, str | int):
            raise ConfigurationError(f"offset {offset!r} must be 'first', 'last', 'next' or a non-negative int")
        if isinstance(offset, int):
            if offset < 0:
                raise ConfigurationError(f"offset {offset} is negative")
            spec = ConsumerOffsetSpecification(OffsetType.OFFSET, offset)
        elif offset in kinds:
            spec = ConsumerOffsetSpecification(kinds[offset], None)
        else:
            raise ConfigurationError(f"offset {offset!r} must be 'first', 'last', 'next' or a non-negative int")
        with map_stream_errors(f"subscribing to {self.stream!r}"):
            self.subscription_id = await self._carrier.subscribe(
                self.stream, callback, offset_specification=spec, subscriber_name=self.name
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
