"""``StreamEnvironment``: the stream wing's facade over its machinery; :class:`smartclient.Environment` (the face
over every wing) is one.

One StreamEnvironment holds, each in a module of its own:

* :class:`~smartclient.stream.topology_cache.TopologyCache`: the locator connection and each stream's members;
* :class:`~smartclient.stream.placement.StreamPlacement`: shared connections by role, where each handle sits;
* :class:`~smartclient.stream.carriers.Carriers`: rstream's carriers, open handles and their losses (the handles'
  :class:`~smartclient.stream.host.StreamHost`);
* :class:`~smartclient.stream.admin.StreamAdmin`: creating, deleting and describing streams and super streams;
* the :class:`~smartclient.stream.connector.StreamConnector`: dials through the resolution seam, checks the node.
"""

from __future__ import annotations

import datetime
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from smartclient._errors import ConfigurationError, HandleClosed
from smartclient.core.address import Address
from smartclient.core.deadline import attempt
from smartclient.core.delivery import Chunk
from smartclient.core.filters import StreamFilter
from smartclient.core.flow import ConsumerFlow
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import (
    ClientCertificate,
    ConnectionOptions,
    Credentials,
    PoolLimits,
    StreamURI,
    Telemetry,
    parse_entry_points,
)
from smartclient.core.stream_arguments import StreamArguments, validate_stream_name
from smartclient.core.topology import Candidates, PlacementPolicy, Role, StreamTopology
from smartclient.core.validation import checked
from smartclient.credentials import EXTERNAL, ExternalLogin, TokenCredentials
from smartclient.management import ManagementClient
from smartclient.options import ClientSettings
from smartclient.stream.host import PlacementRecord
from smartclient.stream.options import ENVIRONMENT_OPTIONS
from smartclient.stream.publishing import BatchingPolicy

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike, SrvDiscovery
    from smartclient.stream.consumer import Consumer, OnError
    from smartclient.stream.handles import Producer
    from smartclient.stream.super_stream import SuperStreamConsumer, SuperStreamProducer

    EntryPoints = str | Address | Sequence[str | Address] | SrvDiscovery

__all__ = ["PlacementRecord", "StreamEnvironment"]

log = logging.getLogger(__name__)
E = TypeVar("E", bound="StreamEnvironment")
P = TypeVar("P")


@checked(ENVIRONMENT_OPTIONS)  # every option of every method, when given, before the method runs
class StreamEnvironment:
    """Connections to a RabbitMQ cluster's streams, each placed on the right node (the stream wing; use
    :class:`smartclient.Environment`, which is one and adds the other protocols).

    :param entry_points: where to reach the cluster first: one or more ``rabbitmq-stream[+tls]://`` URIs or
        ``host:port`` strings or :class:`Address` values, or a :class:`resolvers.SrvDiscovery`.
    :param credentials: a :class:`Credentials`, instead of the URI's user and password (default guest/guest); or a
        :class:`~smartclient.credentials.TokenCredentials` (OAuth2 tokens from a provider, refreshed on every live
        connection before they expire); or :data:`~smartclient.credentials.EXTERNAL` (the client certificate is
        the identity), which is the default with a ``client_certificate`` and no credentials in the URIs.
    :param vhost: override the URI's vhost (default ``/``).
    :param tls: an ``ssl.SSLContext``; a ``+tls`` URI without one gets ``ssl.create_default_context()``.
    :param client_certificate: a :class:`ClientCertificate` presented to every node (mutual TLS), or a function
        answering the current one: it is loaded into ``tls`` before each connection when it changed, so a
        rotated certificate is used by the next connection with no restart.
    :param tls_server_name: the name every TLS connection verifies (SNI and hostname check), instead of
        the one smartclient works out (the LB's name, or the advertised node name; see smartclient.core.tls_names).
    :param resolver: maps advertised node addresses to dialable ones (default :class:`resolvers.Identity`).
    :param allow: an :class:`resolvers.AllowList` checked on every address before it is dialled.
    :param placement: producers on the leader, consumers on replicas (see :class:`PlacementPolicy`).
    :param retry: caps and back-off of each placement (see :class:`RetryPolicy`).
    :param recovery: how producers and consumers recover from a lost connection or a leader move (RecoveryPolicy).
    :param batching: how producers batch ``send()`` (see :class:`BatchingPolicy`).
    :param pool: connection sharing and parking limits (see :class:`PoolLimits`).
    :param management: a :class:`ManagementClient`, for what the stream protocol of an older broker
        cannot do (creating a super stream without the CreateSuperStream command), and for AMQP and MQTT.
    :param connection: the connections' name, frame max, heartbeat, and how long a topology is cached
        (see :class:`ConnectionOptions`).
    :param telemetry: where metrics and spans go (see :class:`Telemetry`).

    Every option is a value: the Environment keeps them in one frozen :class:`ClientSettings` (``settings``),
    which it hands to each wing.  Use it as ``async with Environment(...) as env:``; bad arguments raise
    :class:`ConfigurationError` before any I/O.
    """

    def __init__(
        self,
        entry_points: EntryPoints,
        *,
        credentials: Credentials | TokenCredentials | ExternalLogin | None = None,
        vhost: str | None = None,
        tls: ssl.SSLContext | None = None,
        client_certificate: ClientCertificate | Callable[[], ClientCertificate] | None = None,
        tls_server_name: str | None = None,
        resolver: ResolverLike | None = None,
        allow: AllowList | None = None,
        placement: PlacementPolicy = PlacementPolicy(),
        retry: RetryPolicy = RetryPolicy(),
        recovery: RecoveryPolicy = RecoveryPolicy(),
        batching: BatchingPolicy = BatchingPolicy(),
        pool: PoolLimits = PoolLimits(),
        management: ManagementClient | None = None,
        connection: ConnectionOptions = ConnectionOptions(),
        telemetry: Telemetry = Telemetry(),
    ) -> None:
        from resolvers import Identity, SrvDiscovery
        from smartclient.core.redaction import install_log_redaction

        install_log_redaction()

        self._srv: SrvDiscovery | None = None
        uris: list[StreamURI] = []
        if isinstance(entry_points, SrvDiscovery):
            self._srv = entry_points
        else:
            uris = parse_entry_points([entry_points] if isinstance(entry_points, str | Address) else list(entry_points))
        creds = {u.credentials for u in uris if u.credentials}
        vhosts = {u.vhost for u in uris if u.vhost is not None}
        if len(creds) > 1 and credentials is None:
            raise ConfigurationError("the entry-point URIs carry different credentials; pass credentials=")
        if len(vhosts) > 1 and vhost is None:
            raise ConfigurationError(f"the entry-point URIs name different vhosts {sorted(vhosts)}; pass vhost=")
        if any(u.tls for u in uris) and tls is None:
            tls = ssl.create_default_context()
        self.entry_points = tuple(u.address for u in uris)
        self.resolver = resolver if resolver is not None else Identity()
        if client_certificate is not None and tls is None:
            raise ConfigurationError("client_certificate= needs TLS: give tls= (an ssl.SSLContext) as well")
        if credentials is None:
            credentials = next(iter(creds), EXTERNAL if client_certificate is not None else Credentials())
        self.settings = ClientSettings(
            credentials, vhost if vhost is not None else next(iter(vhosts), "/"), tls, tls_server_name,
            self.resolver, allow, retry, connection, client_certificate)
        self.placement = placement
        self.retry = retry
        self.batching = batching
        self.recovery = recovery
        self.telemetry = telemetry
        from smartclient.resolution import Resolution
        from smartclient.stream.admin import StreamAdmin  # imports rstream: only when an Environment is made
        from smartclient.stream.carriers import Carriers
        from smartclient.stream.connector import StreamConnector
        from smartclient.stream.placement import StreamPlacement
        from smartclient.stream.topology_cache import TopologyCache

        name = connection.name
        resolution = Resolution(self.resolver, allow, tls=tls is not None, tls_override=tls_server_name)
        self.connector = StreamConnector(self.settings, resolution, retry=retry, limits=pool)
        self._topologies = TopologyCache(self.connector, self.entry_points, self._srv, name,
                                         connection.topology_max_age, placement, retry)
        self._placement = StreamPlacement(self.connector, self._topologies, retry, recovery, name)
        entry = self.entry_points[0] if self.entry_points else Address("srv-discovered", 5552)
        self._carriers = Carriers(self._placement, self._topologies, self.settings, pool, recovery, name, entry,
                                  telemetry.meter_provider, telemetry.tracer_provider, telemetry.trace_context)
        self._admin = StreamAdmin(self._topologies, self.connector, self._carriers, self.settings.vhost,
                                  management, name)
        self._closed = False

    def __repr__(self) -> str:
        return (f"Environment(entry_points={[str(a) for a in self.entry_points]}, "
                f"user={self.settings.credentials.username!r}, resolver={self.resolver!r})")

    def _check_open(self) -> None:
        if self._closed:
            raise HandleClosed(f"{self!r} is closed")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: every call but ``close()`` then raises :class:`HandleClosed`."""
        return self._closed

    def _measure(self, placer: P) -> P:
        """``placer`` (an AMQP or MQTT placer of this Environment) measured with its metrics: clients per node,
        resolution times."""
        return self._carriers.watch(placer)

    @property
    def management(self) -> ManagementClient | None:
        """The management API client, for what the stream protocol of an older broker cannot do."""
        return self._admin.management

    @management.setter
    def management(self, value: ManagementClient | None) -> None:
        self._admin.management = value

    # -- lifecycle -----------------------------------------------------------------------------
    async def __aenter__(self: E) -> E:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the locator connection to the first entry point that answers.

        :raises ConnectionFailed: no entry point could be reached (each one's error is listed).
        :raises AuthenticationFailed: the credentials or vhost were refused.
        :raises HandleClosed: this Environment was closed.
        """
        self._check_open()
        with attempt(self.retry.max_time, "opening the locator connection"):
            await self._topologies.locator()

    async def close(self) -> None:
        """Close every producer, consumer and connection of this Environment."""
        if self._closed:
            return
        self._closed = True
        await self._carriers.close()
        await self._topologies.close()
        await self.connector.close()

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
        """The stream's leader and replicas (advertised addresses), from the cache or the broker.

        :raises StreamNotFound: the stream does not exist.
        :raises TopologyError: it has no leader within a few seconds.
        """
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
        """Where every live producer and consumer sits: role, stream, node reported, address dialled."""
        self._check_open()
        return self._placement.placements()

    # -- producers and consumers -------------------------------------------------------------------
    async def producer(self, stream: str, *, name: str | None = None,
                       filter_value: Callable[[Any], str] | None = None,
                       batching: BatchingPolicy | None = None, encoding: str = "amqp") -> Producer:
        """A producer on ``stream``, connected to its leader (see :class:`PlacementPolicy`).

        :param name: producer name, for deduplication (unique per stream).
        :param filter_value: returns the filter value of a message (its body, as given to ``send``),
            for consumers with a :class:`StreamFilter`.
        :param batching: how ``send()`` batches (default: the Environment's :class:`BatchingPolicy`).
        :param encoding: ``"amqp"`` (default): each ``bytes`` body goes as an AMQP 1.0 message of one data section
            (5 to 8 bytes more), which every client reads (AMQP 0.9.1 and 1.0 consumers, the other stream clients);
            ``"raw"``: the body alone, which only stream clients read as bytes (the broker closes an AMQP 0.9.1
            consumer's connection on it).  smartclient's consumers hand back the body either way.
        :raises ConfigurationError: a bad name, ``filter_value`` or ``encoding`` (before any I/O).
        :raises FeatureNotSupported: ``filter_value`` on a broker without filtering.
        :raises StreamNotFound: the stream does not exist.
        :raises PlacementError: the leader could not be reached within the retry policy.
        """
        from smartclient.core.amqp_data import check_encoding
        from smartclient.stream.handles import Producer, open_handle

        self._check_open()
        validate_stream_name(stream)
        check_encoding(encoding, f"a producer on {stream!r}")
        if filter_value is not None:
            await self._admin.require_filtering()
        handle = Producer(self._carriers, self._carriers.carrier(Role.PRODUCER, stream, name), stream, name)
        self._carriers.add(handle)
        await open_handle(handle, self.retry.max_time, batching=batching or self.batching, filter_value=filter_value,
                          encoding=encoding)
        self._carriers.traced(handle)
        return handle

    async def consumer(
        self,
        stream: str,
        callback: Callable[[Any, Any], Awaitable[None] | None] | None = None,
        *,
        on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
        offset: OffsetSpec | str | int | datetime.datetime = "next",
        name: str | None = None,
        single_active: bool = False,
        on_update: Callable[[bool, Consumer], Awaitable[OffsetSpec] | OffsetSpec] | None = None,
        tracking: OffsetTracking | None = None,
        filter: StreamFilter | None = None,
        flow: ConsumerFlow | None = None,
        on_error: OnError = "stop",
        _super_stream: str | None = None,
    ) -> Consumer:
        """A consumer on ``stream``, connected to a replica (spread over the replicas; leader as fallback).

        :param callback: called with each message (``bytes``) and its :class:`MessageContext`; or
        :param on_chunk: called with each :class:`Chunk` instead (its offsets, its bodies split when asked for,
            decoded on demand): one call per chunk, for code that works on batches.  Give one of the two.
        :param offset: an :class:`OffsetSpec`, or ``"first"``, ``"last"``, ``"next"``, an absolute offset,
            a ``datetime`` or an interval such as ``"1h"``.
        :param name: consumer name: needed for offset tracking and single active consumer.
        :param single_active: one instance of ``name`` receives at a time; another takes over on failure.
        :param on_update: for a single active consumer, called with ``(is_active, consumer)`` when it
            becomes active (or not); returns where to resume.  Default: after the stored offset, else
            ``offset``.
        :param tracking: store the offset on the server automatically (see :class:`OffsetTracking`).
        :param filter: only messages with these filter values (see :class:`StreamFilter`).
        :param flow: when credit is granted, so how many chunks wait in memory (see :class:`ConsumerFlow`).
        :param on_error: when the callback raises: ``"stop"`` there (``consumer.failure``: :class:`CallbackFailed`;
            a tracked offset never passes it), ``"skip"`` it (``consumer.callback_errors``), or a function
            ``(exception, context or chunk) -> "skip" | "stop"``.
        :raises FeatureNotSupported: ``filter`` on a broker without filtering.
        :raises ConfigurationError: a bad offset, or tracking or single active without a name.
        :raises NoCandidateNode: replicas are forced and the stream has none.
        :raises PlacementError: no acceptable node could be reached within the retry policy.
        """
        from smartclient.stream.consumer import Consumer, consumer_handler
        from smartclient.stream.handles import open_handle

        self._check_open()
        validate_stream_name(stream)
        handler = consumer_handler(stream, callback, on_chunk, on_error, name=name, single_active=single_active,
                                   tracking=tracking)
        spec = OffsetSpec.parse(offset)  # bad input fails here, before any I/O
        if filter is not None:
            await self._admin.require_filtering()
        handle = Consumer(self._carriers, self._carriers.carrier(Role.CONSUMER, stream, name, flow, single_active),
                          stream, name)
        self._carriers.add(handle)

        async def start() -> OffsetSpec:  # (a single active consumer's start is decided when it becomes active)
            return spec if single_active else await self._admin.concrete_offset(stream, spec, filter)

        traced = handler if on_chunk is not None else self._carriers.traced_callback(stream, handler)
        return await open_handle(handle, self.retry.max_time, start, callback=traced, chunks=on_chunk is not None,
                                 single_active=single_active, on_update=on_update, on_error=on_error,
                                 tracking=tracking, super_stream=_super_stream, stream_filter=filter)

    async def read_arrow(self, stream: str, start: int = 0, end: int | None = None, *,
                         filter: StreamFilter | None = None, settle: float = 1.0,
                         fail_on_data_loss: bool = True, decode: bool = False) -> Any:
        """Offsets ``start`` to ``end`` (exclusive; None: where the stream ends now) of ``stream`` as one
        ``pyarrow.Table``: ``offset``, ``timestamp`` (the chunk's), ``body`` (``binary_view``, over the frames
        read: no body is copied).  Read by a chunk consumer on a replica, with its placement and recovery: every
        offset comes once, in order.  Needs the ``[arrow]`` extra.  See :meth:`iter_arrow`."""
        from smartclient.stream.columnar import read_range

        self._check_open()
        return await read_range(self, stream, start, end, filter=filter, settle=settle,
                                fail_on_data_loss=fail_on_data_loss, decode=decode)

    def iter_arrow(self, stream: str, start: int = 0, end: int | None = None, *, filter: StreamFilter | None = None,
                   settle: float = 1.0, fail_on_data_loss: bool = True, decode: bool = False) -> AsyncIterator[Any]:
        """The range of :meth:`read_arrow` as ``pyarrow.RecordBatch`` es, one per chunk, as they come: a few
        chunks are read ahead, and the consumer's credit waits while the loop is slow.

        :param filter: only messages with these filter values (see :class:`StreamFilter`): the offsets of the
            others are missing from the batches.
        :param settle: seconds with nothing handed over after which the read checks whether anything is left
            before ``end`` (offset-tracking chunks and chunks a filter skips take offsets that are never handed
            over; see :mod:`smartclient.stream.columnar`); a read of offsets not written yet waits for them.
        :param fail_on_data_loss: offsets from ``start`` that retention removed raise :class:`DataLoss` (the
            default), or are skipped with a warning.
        :param decode: each message decoded as an AMQP 1.0 message, with ``properties`` (struct) and
            ``application_properties`` (map) columns (see :meth:`Chunk.to_arrow`).
        :raises ConfigurationError: pyarrow or numpy is missing; a bad ``start``, ``end`` or ``settle``.
        :raises DataLoss: see ``fail_on_data_loss``.
        :raises MessageDecodeError: (``decode``) a message is not an AMQP 1.0 message; it names its offset.
        :raises StreamNotFound: the stream does not exist.
        """
        from smartclient.stream.columnar import iter_range

        self._check_open()
        return iter_range(self, stream, start, end, filter=filter, settle=settle,
                          fail_on_data_loss=fail_on_data_loss, decode=decode)

    async def create_stream(self, stream: str, arguments: StreamArguments | Mapping[str, Any] | None = None,
                            exists_ok: bool = False) -> None:
        """Create a stream.  Arguments are validated first (:class:`StreamArguments`); unknown keys, which
        the broker would silently ignore, are refused.

        :raises ConfigurationError: a bad name or argument; nothing was sent.
        :raises TopologyError: the stream exists and ``exists_ok`` is False; or it exists with other
            arguments (whatever ``exists_ok`` says): the message names those that differ, when the
            Environment has a management client to read them.
        """
        self._check_open()
        await self._admin.create_stream(stream, arguments, exists_ok)

    async def delete_stream(self, stream: str, missing_ok: bool = False) -> None:
        """Delete ``stream``.  This Environment's producers and consumers of it close quietly first: no
        recovery, no warning; their ``failure`` says why and their pending messages fail with that reason.

        :raises StreamNotFound: the stream does not exist and ``missing_ok`` is False.
        """
        self._check_open()
        await self._admin.delete_stream(stream, missing_ok)

    async def stored_offset(self, stream: str, name: str) -> int | None:
        """The offset stored on the server for consumer ``name`` on ``stream``, or None if there is none.

        :raises StreamNotFound: the stream does not exist.
        """
        self._check_open()
        return await self._carriers.stored_offset(stream, name)

    async def stream_stats(self, stream: str, *, node: Address | None = None) -> dict[str, int]:
        """The broker's statistics of ``stream`` (StreamStats): ``first_chunk_id``, ``committed_chunk_id``,
        ``last_chunk_id`` and, from RabbitMQ 4.3, ``committed_offset`` (-1 when empty), on a short connection.
        Each member answers with its own view (the leader's is the authority; a replica's trails it by its
        replication): ``node`` asks that member (for example a consumer's ``node``), by default any one.

        :raises StreamNotFound: the stream does not exist.
        :raises TopologyError: ``node`` is not a member of the stream.
        :raises FeatureNotSupported: the broker has no StreamStats command (before 3.11).
        """
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
        """Create a super stream of ``partitions`` numbered partitions, or one per binding key; return the
        partition names.  Uses the CreateSuperStream command where the broker has it (3.13+), and the AMQP
        topology (exchange, partition streams, bindings) through the management API otherwise, or when
        ``management`` is given here.

        :raises ConfigurationError: bad names, counts or arguments; nothing was sent.
        :raises TopologyError: it exists and ``exists_ok`` is False.
        :raises FeatureNotSupported: no CreateSuperStream command and no management client.
        """
        self._check_open()
        return await self._admin.create_super_stream(super_stream, partitions, binding_keys, arguments,
                                                     exists_ok, management)

    async def delete_super_stream(self, super_stream: str, missing_ok: bool = False) -> None:
        """Delete ``super_stream`` and its partitions; this Environment's producers and consumers of them
        close quietly first (their pending messages fail with the reason).

        :raises StreamNotFound: there is no such super stream and ``missing_ok`` is False.
        """
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

    async def super_stream_producer(
        self, super_stream: str, *, routing: str = "hash", key: Callable[[Any], str] | None = None,
        name: str | None = None, encoding: str = "amqp",
    ) -> SuperStreamProducer:
        """A producer on every partition of ``super_stream``, each on its partition's leader.

        :param routing: ``"hash"`` (murmur3, compatible with the Java/Go/JS clients) or ``"key"`` (the
            broker's bindings, through the Route command).
        :param key: extracts the routing key from a message (or pass ``key=`` to ``send``).
        :param name: producer name for deduplication (the same name on every partition).
        :param encoding: ``"amqp"`` (default) or ``"raw"``, for every partition (see :meth:`producer`).
        """
        from smartclient.core.amqp_data import check_encoding
        from smartclient.stream.super_stream import SuperStreamProducer, opened

        self._check_open()
        check_encoding(encoding, f"a producer on super stream {super_stream!r}")
        return await opened(SuperStreamProducer(self, super_stream, await self.partitions(super_stream), routing, key,
                                                name, encoding))

    async def super_stream_consumer(
        self,
        super_stream: str,
        callback: Callable[[Any, Any], Awaitable[None] | None] | None = None,
        *,
        on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
        offset: OffsetSpec | str | int | datetime.datetime = "next",
        name: str | None = None,
        single_active: bool = False,
        tracking: OffsetTracking | None = None,
        flow: ConsumerFlow | None = None,
        on_error: OnError = "stop",
    ) -> SuperStreamConsumer:
        """A consumer on every partition (each with ``flow``), with a ``callback`` per message or ``on_chunk`` per
        chunk (see :meth:`consumer`).  With ``name`` and ``single_active``, the broker keeps one active consumer
        per partition across every instance of the name, and fails over between them."""
        from smartclient.stream.consumer import consumer_handler
        from smartclient.stream.super_stream import SuperStreamConsumer, opened

        self._check_open()
        spec = OffsetSpec.parse(offset)
        consumer_handler(super_stream, callback, on_chunk, on_error, name=name, single_active=single_active,
                         tracking=tracking)
        return await opened(SuperStreamConsumer(self, super_stream, await self.partitions(super_stream)),
                            callback, spec, name, single_active, tracking, flow, on_chunk, on_error)
