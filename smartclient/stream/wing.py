"""``StreamWing``: the stream wing's facade over its machinery, ``env.streams`` of an :class:`smartclient.Environment`
(the face, which composes the wings and keeps the common stream calls as its own).

One StreamWing holds, each in a module of its own:

* :class:`~smartclient.stream.topology_cache.TopologyCache`: the locator connection and each stream's members;
* :class:`~smartclient.stream.placement.StreamPlacement`: shared connections by role, where each handle sits;
* :class:`~smartclient.stream.carriers.Carriers`: rstream's carriers, open handles and their losses (the handles'
  :class:`~smartclient.stream.host.StreamHost`);
* :class:`~smartclient.stream.admin.StreamAdmin`: creating, deleting and describing streams and super streams;
* the :class:`~smartclient.stream.connector.StreamConnector`: dials through the resolution seam, checks the node.

It is built from the Environment's one :class:`~smartclient.options.ClientSettings`; producers and consumers are
made from :class:`~smartclient.options.ProducerOptions` and :class:`~smartclient.options.ConsumerOptions`, typed
all the way to the rstream seam."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from smartclient import _otel
from smartclient._errors import HandleClosed
from smartclient.core.address import Address
from smartclient.core.deadline import attempt
from smartclient.core.delivery import Chunk
from smartclient.core.filters import StreamFilter
from smartclient.core.recovery import RecoveryEvent, RecoveryPolicy
from smartclient.core.settings import PoolLimits, Telemetry
from smartclient.core.stream_arguments import StreamArguments, validate_stream_name
from smartclient.core.topology import Candidates, PlacementPolicy, Role, StreamTopology
from smartclient.core.validation import checked
from smartclient.management import ManagementClient
from smartclient.options import ClientSettings, ConsumerOptions, ProducerOptions
from smartclient.stream.host import PlacementRecord
from smartclient.stream.options import ENVIRONMENT_OPTIONS
from smartclient.stream.publishing import BatchingPolicy
from smartclient.telemetry import EnvironmentTelemetry

if TYPE_CHECKING:
    from resolvers import SrvDiscovery
    from smartclient.stream.consumer import Consumer
    from smartclient.stream.handles import Producer
    from smartclient.stream.super_stream import SuperStreamConsumer, SuperStreamProducer

__all__ = ["PlacementRecord", "StreamWing"]

log = logging.getLogger(__name__)
E = TypeVar("E", bound="StreamWing")
P = TypeVar("P")


@checked(ENVIRONMENT_OPTIONS)  # every option of every method, when given, before the method runs
class StreamWing:
    """Connections to a RabbitMQ cluster's streams, each placed on the right node: ``env.streams``.

    :param settings: the Environment's one :class:`ClientSettings` (credentials, vhost, TLS, resolver, allow-list,
        retry policy, connection options).
    :param entry_points: where to reach the cluster first (the URIs' addresses), or none with ``srv``.
    :param srv: a :class:`resolvers.SrvDiscovery` that finds the entry points instead.
    :param placement: producers on the leader, consumers on replicas (see :class:`PlacementPolicy`).
    :param recovery: how producers and consumers recover from a lost connection or a leader move (RecoveryPolicy).
    :param batching: how producers batch ``send()`` by default (see :class:`BatchingPolicy`).
    :param pool: connection sharing and parking limits (see :class:`PoolLimits`).
    :param management: the management API, for what the stream protocol of an older broker cannot do.
    :param telemetry: where metrics and spans go (see :class:`Telemetry`).
    """

    def __init__(
        self,
        settings: ClientSettings,
        entry_points: tuple[Address, ...] = (),
        *,
        srv: SrvDiscovery | None = None,
        placement: PlacementPolicy = PlacementPolicy(),
        recovery: RecoveryPolicy = RecoveryPolicy(),
        batching: BatchingPolicy = BatchingPolicy(),
        pool: PoolLimits = PoolLimits(),
        management: ManagementClient | None = None,
        telemetry: Telemetry = Telemetry(),
        instruments: EnvironmentTelemetry | None = None,
    ) -> None:
        from smartclient.resolution import Resolution
        from smartclient.stream.admin import StreamAdmin  # imports rstream: only when an Environment is made
        from smartclient.stream.carriers import Carriers
        from smartclient.stream.connector import StreamConnector
        from smartclient.stream.placement import StreamPlacement
        from smartclient.stream.topology_cache import TopologyCache

        self.settings = settings
        self.entry_points = entry_points
        self._srv = srv
        self.placement = placement
        self.retry = retry = settings.retry
        self.batching = batching
        self.recovery = recovery
        self.telemetry = telemetry
        connection = settings.connection
        name = connection.name
        resolution = Resolution(settings.resolver, settings.allow, tls=settings.tls is not None,
                                tls_override=settings.tls_server_name)
        self.connector = StreamConnector(settings, resolution, retry=retry, limits=pool)
        self._topologies = TopologyCache(self.connector, entry_points, srv, name, connection.topology_max_age,
                                         placement, retry)
        self._placement = StreamPlacement(self.connector, self._topologies, retry, recovery, name)
        self.connector.idle = self._topologies.locator  # a new token is tried there first
        entry = entry_points[0] if entry_points else Address("srv-discovered", 5552)
        #: the instruments its readings go to: its Environment's, or (built alone, as a Spark task builds it) its own
        self._own = None
        if instruments is None and (meter := _otel.meter(telemetry.meter_provider)) is not None:
            instruments = self._own = EnvironmentTelemetry(meter, timed=_otel.configured(telemetry.meter_provider))
        self._carriers = Carriers(self._placement, self._topologies, settings, pool, recovery, name, entry,
                                  instruments, telemetry.tracer_provider, telemetry.trace_context)
        if self._own is not None:
            self._carriers.on_recovery = self._own.recovered
        self._admin = StreamAdmin(self._topologies, self.connector, self._carriers, settings.vhost, management, name)
        self._closed = False

    def __repr__(self) -> str:
        return (f"StreamWing(entry_points={[str(a) for a in self.entry_points]}, "
                f"user={self.settings.credentials.username!r}, resolver={self.settings.resolver!r})")

    def _check_open(self) -> None:
        if self._closed:
            raise HandleClosed(f"{self!r} is closed")

    @property
    def closed(self) -> bool:
        """See :meth:`smartclient.Environment.closed`."""
        return self._closed

    @property
    def on_recovery(self) -> Callable[[RecoveryEvent], None] | None:
        """Told of every recovery of a producer or consumer that ended (the Environment's recovery hooks)."""
        return self._carriers.on_recovery

    @on_recovery.setter
    def on_recovery(self, hook: Callable[[RecoveryEvent], None] | None) -> None:
        self._carriers.on_recovery = hook

    @property
    def management(self) -> ManagementClient | None:
        """See :meth:`smartclient.Environment.management`."""
        return self._admin.management

    @management.setter
    def management(self, value: ManagementClient | None) -> None:
        self._admin.management = value

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """See :meth:`smartclient.Environment.start`."""
        self._check_open()
        with attempt(self.retry.max_time, "opening the locator connection"):
            await self._topologies.locator()

    async def close(self) -> None:
        """See :meth:`smartclient.Environment.close`."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._carriers.close()
            await self._topologies.close()
            await self.connector.close()
        finally:
            if self._own is not None:
                self._own.close()

    def resources(self) -> dict[str, int]:
        """The sizes of this Environment's tables, by name: connections (placed, parked, shared), handles,
        pending confirms, metadata-cache entries, placement records, and the publishers, subscribers, handlers,
        delivery queues and tasks it drives in rstream.  For a long-lived service's checks: each should come back
        to its level once connections, streams and nodes have come and gone.  Call it on the event loop.

        :raises HandleClosed: this Environment was closed."""
        from smartclient.stream.accounting import resources

        self._check_open()
        return resources(self)

    # -- topology and placement ------------------------------------------------------------------
    async def topology(self, stream: str) -> StreamTopology:
        """See :meth:`smartclient.Environment.topology`."""
        self._check_open()
        return await self._topologies.with_routes(await self._topologies.topology(stream))

    def invalidate(self, stream: str | None = None, node: Address | None = None) -> None:
        """Forget cached topologies: one stream's, those with a member on ``node``, or all."""
        self._check_open()
        self._topologies.drop(stream, node)

    async def candidates(self, stream: str, role: Role) -> Candidates:
        """The nodes a producer or consumer of ``stream`` may use, by tier (see :class:`Candidates`)."""
        self._check_open()
        return await self._topologies.candidates(stream, role, self._placement.consumer_load(stream))

    def placements(self) -> list[PlacementRecord]:
        """See :meth:`smartclient.Environment.placements`."""
        self._check_open()
        return self._placement.placements()

    # -- producers and consumers -------------------------------------------------------------------
    async def producer(self, stream: str, options: ProducerOptions = ProducerOptions()) -> Producer:
        """A producer on ``stream``, connected to its leader (see :meth:`smartclient.Environment.producer`).

        :raises FeatureNotSupported: a filter value on a broker without filtering.
        :raises StreamNotFound: the stream does not exist.
        :raises PlacementError: the leader could not be reached within the retry policy.
        """
        from smartclient.stream.handles import Producer, open_handle

        self._check_open()
        validate_stream_name(stream)
        if options.filter_value is not None:
            await self._admin.require_filtering()
        handle = Producer(self._carriers, self._carriers.carrier(Role.PRODUCER, stream, options.name), stream,
                          options.name)
        self._carriers.add(handle)
        batching = options.batching or self.batching
        await open_handle(handle, self.retry.max_time, lambda: handle._place(options, batching))
        self._carriers.traced(handle)
        return handle

    async def consumer(self, stream: str, callback: Callable[[Any, Any], Awaitable[None] | None] | None = None, *,
                       on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
                       options: ConsumerOptions = ConsumerOptions(), super_stream: str | None = None) -> Consumer:
        """A consumer on ``stream``, connected to a replica (see :meth:`smartclient.Environment.consumer`);
        ``super_stream``: the super stream whose partition ``stream`` is (a single active consumer's group).

        :raises FeatureNotSupported: a filter on a broker without filtering.
        :raises ConfigurationError: no callback, or both a callback and ``on_chunk``.
        :raises NoCandidateNode: replicas are forced and the stream has none.
        :raises PlacementError: no acceptable node could be reached within the retry policy.
        """
        from smartclient.stream.consumer import Consumer, consumer_handler
        from smartclient.stream.handles import open_handle

        self._check_open()
        validate_stream_name(stream)
        handler = consumer_handler(stream, callback, on_chunk)
        if options.filter is not None:
            await self._admin.require_filtering()
        carrier = self._carriers.carrier(Role.CONSUMER, stream, options.name, options.flow, options.single_active)
        handle = Consumer(self._carriers, carrier, stream, options.name)
        self._carriers.add(handle)
        traced = handler if on_chunk is not None else self._carriers.traced_callback(stream, handler)

        async def subscribe() -> None:  # (a single active consumer's start is decided when it becomes active)
            start = options.offset if options.single_active else await self._admin.concrete_offset(
                stream, options.offset, options.filter)
            await handle._subscribe(traced, start, options, chunks=on_chunk is not None, super_stream=super_stream)

        return await open_handle(handle, self.retry.max_time, subscribe)

    async def read_arrow(self, stream: str, start: int = 0, end: int | None = None, *,
                         filter: StreamFilter | None = None, settle: float = 1.0,
                         fail_on_data_loss: bool = True, decode: bool = False) -> Any:
        """See :meth:`smartclient.Environment.read_arrow`."""
        from smartclient.stream.columnar import read_range

        self._check_open()
        return await read_range(self, stream, start, end, filter=filter, settle=settle,
                                fail_on_data_loss=fail_on_data_loss, decode=decode)

    def iter_arrow(self, stream: str, start: int = 0, end: int | None = None, *, filter: StreamFilter | None = None,
                   settle: float = 1.0, fail_on_data_loss: bool = True, decode: bool = False) -> AsyncIterator[Any]:
        """See :meth:`smartclient.Environment.iter_arrow`."""
        from smartclient.stream.columnar import iter_range

        self._check_open()
        return iter_range(self, stream, start, end, filter=filter, settle=settle,
                          fail_on_data_loss=fail_on_data_loss, decode=decode)

    async def create_stream(self, stream: str, arguments: StreamArguments | Mapping[str, Any] | None = None,
                            exists_ok: bool = False) -> None:
        """See :meth:`smartclient.Environment.create_stream`."""
        self._check_open()
        await self._admin.create_stream(stream, arguments, exists_ok)

    async def delete_stream(self, stream: str, missing_ok: bool = False) -> None:
        """See :meth:`smartclient.Environment.delete_stream`."""
        self._check_open()
        await self._admin.delete_stream(stream, missing_ok)

    async def stored_offset(self, stream: str, name: str) -> int | None:
        """See :meth:`smartclient.Environment.stored_offset`."""
        self._check_open()
        return await self._carriers.stored_offset(stream, name)

    async def stream_stats(self, stream: str, *, node: Address | None = None) -> dict[str, int]:
        """See :meth:`smartclient.Environment.stream_stats`."""
        self._check_open()
        return await self._admin.stream_stats(stream, node)

    async def command_versions(self) -> dict[int, tuple[int, int]]:
        """The broker's stream commands: ``{key: (min_version, max_version)}`` (asked once, then cached)."""
        self._check_open()
        return await self._admin.command_versions()

    async def require_filtering(self) -> None:
        """:raises FeatureNotSupported: the broker has no filtering (Publish v2, RabbitMQ 3.13+)."""
        self._check_open()
        await self._admin.require_filtering()

    # -- super streams ------------------------------------------------------------------------------
    async def create_super_stream(
        self,
        super_stream: str,
        *,
        partitions: int | None = None,
        binding_keys: Sequence[str] | None = None,
        arguments: StreamArguments | Mapping[str, Any] | None = None,
        exists_ok: bool = False,
        management: ManagementClient | None = None,
    ) -> list[str]:
        """See :meth:`smartclient.Environment.create_super_stream`."""
        self._check_open()
        return await self._admin.create_super_stream(super_stream, partitions, binding_keys, arguments,
                                                     exists_ok, management)

    async def delete_super_stream(self, super_stream: str, missing_ok: bool = False) -> None:
        """See :meth:`smartclient.Environment.delete_super_stream`."""
        self._check_open()
        await self._admin.delete_super_stream(super_stream, missing_ok)

    async def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of ``super_stream``, in routing order.

        :raises StreamNotFound: there is no such super stream.
        """
        self._check_open()
        return await self._admin.partitions(super_stream)

    async def route(self, super_stream: str, routing_key: str) -> list[str]:
        """The partitions the broker's bindings give for ``routing_key`` (the Route command)."""
        self._check_open()
        return await self._admin.route(super_stream, routing_key)

    async def super_stream_producer(self, super_stream: str, *, routing: str = "hash",
                                    key: Callable[[Any], str] | None = None,
                                    options: ProducerOptions = ProducerOptions()) -> SuperStreamProducer:
        """A producer on every partition of ``super_stream``, each on its partition's leader (see
        :meth:`smartclient.Environment.super_stream_producer`)."""
        from smartclient.stream.super_stream import SuperStreamProducer, opened

        self._check_open()
        return await opened(SuperStreamProducer(self, super_stream, await self.partitions(super_stream), routing, key,
                                                options))

    async def super_stream_consumer(
        self, super_stream: str, callback: Callable[[Any, Any], Awaitable[None] | None] | None = None, *,
        on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
        options: ConsumerOptions = ConsumerOptions(),
    ) -> SuperStreamConsumer:
        """A consumer on every partition (see :meth:`smartclient.Environment.super_stream_consumer`)."""
        from smartclient.stream.consumer import consumer_handler
        from smartclient.stream.super_stream import SuperStreamConsumer, opened

        self._check_open()
        consumer_handler(super_stream, callback, on_chunk)
        return await opened(SuperStreamConsumer(self, super_stream, await self.partitions(super_stream)),
                            callback, on_chunk, options)
