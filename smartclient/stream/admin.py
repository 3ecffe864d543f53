"""Stream and super-stream administration: create, delete, list partitions, route, statistics, commands.

Everything goes through the shared locator connection, except StreamStats (a short connection of its own,
placed on a member) and, on brokers without the CreateSuperStream command, super streams, whose AMQP
topology (exchange, partition streams, bindings) is built through the management API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from smartclient._errors import (
    REFUSALS,
    ConnectionFailed,
    FeatureNotSupported,
    ManagementError,
    SmartClientError,
    StreamNotFound,
    TopologyError,
)
from smartclient.core.deadline import step
from smartclient.core.filters import StreamFilter
from smartclient.core.offsets import OffsetSpec
from smartclient.core.stream_arguments import StreamArguments, validate_stream_name
from smartclient.core.topology import Role
from smartclient.stream import _rstream
from smartclient.stream._rstream import map_stream_errors

if TYPE_CHECKING:
    from smartclient.core.address import Address
    from smartclient.management import ManagementClient
    from smartclient.stream.carriers import Carriers
    from smartclient.stream.connector import StreamConnector
    from smartclient.stream.topology_cache import TopologyCache

log = logging.getLogger(__name__)

__all__ = ["StreamAdmin", "partition_names"]

CREATE_SUPER_STREAM = 29  # the command key of CreateSuperStream (RabbitMQ 3.13+)


def partition_names(super_stream: str, partitions: int | None, binding_keys: Sequence[str] | None) -> tuple[
        list[str], list[str]]:
    """The partition streams and binding keys of a new super stream, named as the other clients name them:
    ``<super>-<i>`` bound with ``i`` for a count, ``<super>-<key>`` bound with ``key`` for binding keys."""
    from smartclient._errors import ConfigurationError

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


class StreamAdmin:
    """Creates, deletes and describes streams and super streams for one Environment."""

    def __init__(self, topologies: TopologyCache, connector: StreamConnector, carriers: Carriers, vhost: str,
                 management: ManagementClient | None, connection_name: str) -> None:
        self.topologies = topologies
        self.connector = connector
        self.carriers = carriers
        self.vhost = vhost
        self.management = management
        self.connection_name = connection_name
        self._commands: dict[int, tuple[int, int]] | None = None

    async def create_stream(self, stream: str, arguments: StreamArguments | Mapping[str, Any] | None,
                            exists_ok: bool) -> None:
        validate_stream_name(stream)
        args = StreamArguments.coerce(arguments)
        locator = await self.topologies.locator()
        with map_stream_errors(f"creating stream {stream!r}"):
            outcome = await _rstream.create_stream(locator, stream, args.to_stream_protocol())
        if outcome == "exists" and not exists_ok:
            raise TopologyError(f"stream {stream!r} already exists")
        if outcome == "differs":
            raise TopologyError(await self._arguments_differ(stream, args))

    async def _arguments_differ(self, stream: str, asked: StreamArguments) -> str:
        """Why creating ``stream`` with ``asked`` met PreconditionFailed: it exists with other arguments."""
        base = f"stream {stream!r} already exists with other arguments than {asked.to_amqp()}"
        if self.management is None:
            return base + " (give the Environment a ManagementClient to see which differ)"
        path = f"/api/queues/{quote(self.vhost, safe='')}/{quote(stream, safe='')}"
        try:
            found: dict[str, Any] = (await asyncio.to_thread(self.management.get, path)).get("arguments", {})
        except ManagementError as exc:
            return base + f" (reading them through the management API failed: {exc})"
        wanted = asked.to_amqp()
        differ = [f"{key}: asked {wanted.get(key)!r}, it has {found.get(key)!r}"
                  for key in sorted(set(wanted) | set(found))
                  if str(wanted.get(key)) != str(found.get(key))]
        return f"stream {stream!r} already exists with other arguments: " + ("; ".join(differ) or "none differ")

    async def delete_stream(self, stream: str, missing_ok: bool) -> None:
        await self.carriers.end_handles_of({stream}, f"stream {stream!r} was deleted by this Environment")
        try:
            locator = await self.topologies.locator()
            with map_stream_errors(f"deleting stream {stream!r}"):
                await locator.delete_stream(stream)
        except StreamNotFound:
            if not missing_ok:
                raise
        finally:
            self._forget({stream})

    def _forget(self, streams: set[str]) -> None:
        """Its handles were ended: what they left goes with them even when the deletion failed (the caller tries
        it again; the 2-hour soak kept the totals of each short-lived stream whose deletion a rolling restart
        cut, for the rest of the run)."""
        for stream in streams:
            self.topologies.drop(stream=stream)
            self.carriers.forget_when_unused(stream)

    async def stream_stats(self, stream: str, node: Address | None = None) -> dict[str, int]:
        from smartclient.stream.stats import stream_stats_from

        topo = await self.topologies.topology(stream)
        candidates = topo.candidates(Role.LOCATOR) if node is None else topo.member_candidates(node)
        return await stream_stats_from(self.connector, candidates, stream, f"{self.connection_name}-stats")

    async def command_versions(self) -> dict[int, tuple[int, int]]:
        if self._commands is None:
            locator = await self.topologies.locator()
            with map_stream_errors("asking the broker which commands it supports"):
                self._commands = await step("command versions", _rstream.command_versions(locator))
        return self._commands

    async def concrete_offset(self, stream: str, spec: OffsetSpec, stream_filter: StreamFilter | None) -> OffsetSpec:
        """``spec`` as the concrete offset it means now (ResolveOffsetSpec, RabbitMQ 4.3+), so that a consumer
        recovered before its first message starts where it first would have; ``spec`` itself where the
        broker lacks the command, has no offset for it (an empty stream) or the kind does not move."""
        from smartclient.stream.resolve_offset import KEY, RESOLVABLE, resolve_offset_spec

        if spec.kind not in RESOLVABLE or KEY not in await self.command_versions():
            return spec
        try:
            with map_stream_errors(f"resolving the offset {spec} of {stream!r}"):  # (it asks a member: aside)
                offset = await self.topologies.aside(
                    stream, "ResolveOffsetSpec", lambda client: resolve_offset_spec(client, stream, spec,
                                                                                      stream_filter))
        except REFUSALS:
            raise
        except ConnectionFailed as exc:  # (a member of another version, in a rolling upgrade, closes on it)
            log.info("the offset %s of %r is not resolved (%s): the consumer starts at %s itself", spec, stream, exc,
                     spec)
            return spec
        return spec if offset is None else OffsetSpec.at(offset)

    async def require_filtering(self) -> None:
        if (await self.command_versions()).get(2, (1, 1))[1] < 2:
            raise FeatureNotSupported(
                "the broker does not support stream filtering (Publish v2): it needs RabbitMQ 3.13+ with the "
                "stream_filtering feature flag enabled"
            )

    # -- super streams ---------------------------------------------------------------------------------
    async def create_super_stream(self, super_stream: str, partitions: int | None, binding_keys: Sequence[str] | None,
                                  arguments: StreamArguments | Mapping[str, Any] | None, exists_ok: bool,
                                  management: ManagementClient | None) -> list[str]:
        validate_stream_name(super_stream)
        names, keys = partition_names(super_stream, partitions, binding_keys)
        for name in names:
            validate_stream_name(name)
        args = StreamArguments.coerce(arguments)
        if management is None and CREATE_SUPER_STREAM not in await self.command_versions():
            management = self.management
            if management is None:
                raise FeatureNotSupported(
                    "the broker has no CreateSuperStream command (RabbitMQ < 3.13): give the Environment a "
                    "ManagementClient (management=...) to build the super stream's AMQP topology instead"
                )
        if management is not None:
            await asyncio.to_thread(self._create_super_stream_over_http, management, super_stream, names, keys,
                                    args, exists_ok)
            return names
        with map_stream_errors(f"creating super stream {super_stream!r}"):
            created = await self.topologies.on_own_connection("admin", lambda client: _rstream.create_super_stream(
                client, super_stream, names, keys, args.to_stream_protocol()))
        if not created and not exists_ok:
            raise TopologyError(f"super stream {super_stream!r} already exists")
        return names

    def _create_super_stream_over_http(self, api: ManagementClient, super_stream: str, names: list[str],
                                       keys: list[str], args: StreamArguments, exists_ok: bool) -> None:
        vhost = quote(self.vhost, safe="")
        try:
            api.get(f"/api/exchanges/{vhost}/{quote(super_stream, safe='')}")
            if not exists_ok:
                raise TopologyError(f"super stream {super_stream!r} already exists")
        except ManagementError as exc:
            if exc.status != 404:
                raise
        api.put(f"/api/exchanges/{vhost}/{quote(super_stream, safe='')}",
                {"type": "direct", "durable": True, "arguments": {"x-super-stream": True}})
        for order, (name, key) in enumerate(zip(names, keys, strict=True)):
            api.put(f"/api/queues/{vhost}/{quote(name, safe='')}", {"durable": True, "arguments": args.to_amqp()})
            api.post(f"/api/bindings/{vhost}/e/{quote(super_stream, safe='')}/q/{quote(name, safe='')}",
                     {"routing_key": key, "arguments": {"x-stream-partition-order": order}})

    async def delete_super_stream(self, super_stream: str, missing_ok: bool) -> None:
        locator = await self.topologies.locator()
        try:
            with map_stream_errors(f"listing the partitions of {super_stream!r}"):
                partitions = set(await locator.partitions(super_stream))
        except SmartClientError:
            partitions = set()
        await self.carriers.end_handles_of(partitions, f"super stream {super_stream!r} was deleted by this Environment")
        try:
            with map_stream_errors(f"deleting super stream {super_stream!r}"):
                await self.topologies.on_own_connection("admin", lambda client: _rstream.delete_super_stream(
                    client, super_stream, len(partitions)))
        except StreamNotFound:
            if not missing_ok:
                raise
        finally:
            self._forget(partitions)

    async def partitions(self, super_stream: str) -> list[str]:
        locator = await self.topologies.locator()
        with map_stream_errors(f"listing the partitions of {super_stream!r}"):
            names = list(await locator.partitions(super_stream))
        if not names:
            raise StreamNotFound(f"super stream {super_stream!r} does not exist or has no partitions")
        return names

    async def route(self, super_stream: str, routing_key: str) -> list[str]:
        locator = await self.topologies.locator()
        with map_stream_errors(f"routing {routing_key!r} in {super_stream!r}"):
            return list(await locator.route(routing_key, super_stream))
