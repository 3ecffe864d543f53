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
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError, TopologyError
from .routing import hash_partition

if TYPE_CHECKING:
    from .environment import Environment
    from .offsets import OffsetSpec, OffsetTracking
    from .stream import Consumer, Producer

__all__ = ["SuperStreamConsumer", "SuperStreamProducer", "partition_names"]

ROUTINGS = ("hash", "key")


def partition_names(super_stream: str, partitions: int | None, binding_keys: Sequence[str] | None) -> tuple[
        list[str], list[str]]:
    """The partition streams and binding keys of a new super stream, named as the other clients name them:
    ``<super>-<i>`` bound with ``i`` for a count, ``<super>-<key>`` bound with ``key`` for binding keys."""
    if (partitions is None) == (binding_keys is None):
        raise ConfigurationError("give a super stream either partitions=N or binding_keys=[...], not both")
    if binding_keys is not None:
        keys = list(binding_keys)
        if not keys or len(set(keys)) != len(keys) or not all(isinstance(k, str) and k for k in keys):
            raise ConfigurationError(f"binding_keys {keys!r} must be distinct non-empty strings")
    else:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigurationError(f"partitions must be a positive int, not {partitions!r}")
        keys = [str(i) for i in range(partitions)]
    return [f"{super_stream}-{k}" for k in keys], keys


class SuperStreamProducer:
    """Publishes to a super stream: routes each message to a partition, whose producer sits on its leader."""

    def __init__(self, env: Environment, super_stream: str, partitions: list[str], routing: str,
                 key: Callable[[Any], str] | None, name: str | None) -> None:
        if routing not in ROUTINGS:
            raise ConfigurationError(f"routing {routing!r} must be one of {ROUTINGS}")
        self.env = env
        self.super_stream = super_stream
        self.partitions = partitions
        self.routing = routing
        self.key = key
        self.name = name
        self.producers: dict[str, Producer] = {}
        self._routes: dict[str, list[str]] = {}

    async def _open(self) -> None:
        for partition in self.partitions:
            self.producers[partition] = await self.env.producer(partition, name=self.name)

    async def route(self, body: Any, key: str | None = None) -> list[str]:
        """The partitions a message goes to (one for hash routing; those bound to the key for key routing)."""
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

    async def send(self, body: Any, *, key: str | None = None, publishing_id: int | None = None) -> list[str]:
        """Send one message to its partition(s); return the partitions it went to."""
        targets = await self.route(body, key)
        for partition in targets:
            await self.producers[partition].send(body, publishing_id=publishing_id)
        return targets

    async def send_wait(self, body: Any, *, key: str | None = None, publishing_id: int | None = None) -> list[str]:
        targets = await self.route(body, key)
        for partition in targets:
            await self.producers[partition].send_wait(body, publishing_id=publishing_id)
        return targets

    async def close(self) -> None:
        for producer in self.producers.values():
            await producer.close()


class SuperStreamConsumer:
    """Consumes every partition of a super stream; with ``single_active``, one active consumer per
    partition across all instances sharing the name."""

    def __init__(self, env: Environment, super_stream: str, partitions: list[str]) -> None:
        self.env = env
        self.super_stream = super_stream
        self.partitions = partitions
        self.consumers: dict[str, Consumer] = {}

    async def _open(self, callback: Callable[[Any, Any], Awaitable[None] | None], offset: OffsetSpec,
                    name: str | None, single_active: bool, tracking: OffsetTracking | None) -> None:
        for partition in self.partitions:
            self.consumers[partition] = await self.env.consumer(
                partition, callback, offset=offset, name=name, single_active=single_active, tracking=tracking,
                _super_stream=self.super_stream if single_active else None,
            )

    @property
    def active_partitions(self) -> list[str]:
        return [p for p, c in self.consumers.items() if c.active]

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.consumers.values()))
