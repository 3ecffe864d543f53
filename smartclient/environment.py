"""``Environment``: the one face, which composes its wings.

An Environment holds each wing as a part, every one built from its one frozen
:class:`~smartclient.options.ClientSettings` (credentials, vhost, TLS, resolver, allow-list, retry policy,
connection options), and owns what they share: the management API, the telemetry, and the recovery hook
(:meth:`Environment.on_recovery`)::

    smartclient.environment  (this face)
        ├── env.streams  smartclient.stream   (rstream)                      StreamWing
        ├── env.amqp     smartclient.amqp     (pika)                         AmqpPlacer
        ├── env.amqp10   smartclient.amqp10   (rabbitmq-amqp-python-client)  Amqp10Placer
        ├── env.mqtt     smartclient.mqtt     (paho-mqtt)                    MqttPlacer
        └── federated_broker()  smartclient.federation (this cluster as one broker of a topology)

The wings import none of each other, nor this module, and each is imported only when first used: a service that
speaks only MQTT never imports rstream's wing's machinery beyond its construction, nor pika.  The common calls
(producers, consumers, streams, super streams, AMQP connections, MQTT clients) stay here as documented methods that
hand over to their wing; the rest is the wing's own (``env.streams.partitions(...)``).  A new wing is the wing, its
seam, and one property here.
"""

from __future__ import annotations

import datetime
import logging
import ssl
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from smartclient import _otel
from smartclient._errors import ConfigurationError, HandleClosed
from smartclient.core.address import Address
from smartclient.core.batching import BatchingPolicy
from smartclient.core.broker_nodes import CutOffNodes
from smartclient.core.delivery import Chunk
from smartclient.core.filters import StreamFilter
from smartclient.core.flow import ConsumerFlow
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.recovery import RecoveryEvent, RecoveryPolicy
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import ClientCertificate, ConnectionOptions, Credentials, PoolLimits, Telemetry
from smartclient.core.stream_arguments import StreamArguments
from smartclient.core.topology import PlacementPolicy, StreamTopology
from smartclient.core.validation import Check, checked, function, instance, text, whole
from smartclient.credentials import ExternalLogin, TokenCredentials
from smartclient.management import ManagementClient
from smartclient.options import (
    ClientSettings,
    ConsumerOptions,
    OnError,
    ProducerOptions,
    client_settings,
    given_options,
    settings,
)
from smartclient.stream.host import PlacementRecord
from smartclient.stream.options import ENVIRONMENT_OPTIONS
from smartclient.stream.wing import StreamWing
from smartclient.telemetry import EnvironmentTelemetry

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike, SrvDiscovery
    from smartclient.amqp.placement import AmqpPlacer, PlacedConnection
    from smartclient.amqp10.placement import Amqp10Placer
    from smartclient.federation.topology import FederatedBroker
    from smartclient.mqtt.fleet import MqttFleet
    from smartclient.mqtt.placement import MqttOptions, MqttPlacer, PlacedMqttClient
    from smartclient.node_placement import NodePlacer
    from smartclient.stream.consumer import Consumer
    from smartclient.stream.handles import Producer
    from smartclient.stream.super_stream import SuperStreamConsumer, SuperStreamProducer

    EntryPoints = str | Address | Sequence[str | Address] | SrvDiscovery

__all__ = ["Environment"]

log = logging.getLogger(__name__)
E = TypeVar("E", bound="Environment")
P = TypeVar("P", bound="NodePlacer[Any]")


@runtime_checkable
class RecoveryReporting(Protocol):
    """A wing's placer that tells of the recoveries it makes (AMQP 1.0's, MQTT's)."""

    on_recovery: Callable[[RecoveryEvent], None] | None


def _mqtt_options(name: str, value: Any) -> None:
    from smartclient.mqtt.placement import MqttOptions

    instance(name, value, MqttOptions)


#: the stream wing's options, and those of the AMQP and MQTT methods
OPTIONS: dict[str, Check | None] = {
    **ENVIRONMENT_OPTIONS,
    "options": None,  # a ProducerOptions or ConsumerOptions (each checks itself), or an MqttOptions (its method's)
    "mqtt_placer.options": _mqtt_options,
    "mqtt_client.options": _mqtt_options,
    "mqtt_fleet.options": _mqtt_options,
    "mqtt_placer.tls": settings((ssl.SSLContext, bool)),
    "size": partial(whole, low=1),
    "federated_broker.name": text,
    "amqp_uri": text,
    "on_recovery.hook": partial(function, takes="RecoveryEvent", optional=False),
}


@checked(OPTIONS)  # every option of every method, when given, before the method runs
class Environment:
    """Connections to a RabbitMQ cluster, each placed on the right node: stream producers on the leader, consumers
    on replicas, AMQP 0.9.1 and 1.0 connections and MQTT clients on the nodes asked for, all through the same
    resolver.  A :class:`resolvers.LoadBalancer` resolver with a listener per protocol (``amqp=``, ``mqtt=``,
    ``mqtt_tls=``) sends each protocol's connections through its listener, and each one is checked.

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
    :param management: a :class:`ManagementClient`, for what the stream protocol of an older broker cannot do
        (creating a super stream without the CreateSuperStream command), and for AMQP and MQTT.
    :param connection: the connections' name, frame max, heartbeat, and how long a topology is cached
        (see :class:`ConnectionOptions`).
    :param telemetry: where metrics and spans go (see :class:`Telemetry`).

    Every wing logs in with ``credentials=`` (a password, OAuth2 tokens from a provider, or EXTERNAL with
    ``client_certificate=``); with tokens, each keeps its live connections on the current token (stream and AMQP
    connections take it on the open connection, MQTT clients hand over to it); :meth:`close` stops that for every
    wing.  Use it as ``async with Environment(...) as env:``; bad arguments raise :class:`ConfigurationError`
    before any I/O.
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
        from smartclient.core.redaction import install_log_redaction

        install_log_redaction()
        #: the one settings value every wing is built from
        arguments = ClientSettings(credentials or Credentials(), vhost or "/", tls, tls_server_name, resolver, allow,
                                   retry, connection, client_certificate)
        self.settings, entries, srv = client_settings(
            entry_points, arguments, credentials_given=credentials is not None, vhost_given=vhost is not None)
        self.recovery = recovery
        self.telemetry = telemetry
        self._management = management
        #: the instruments every wing's measurements go to (None without a meter provider): the face's own
        self.instruments: EnvironmentTelemetry | None = None
        if (meter := _otel.meter(telemetry.meter_provider)) is not None:
            self.instruments = EnvironmentTelemetry(meter, timed=_otel.configured(telemetry.meter_provider))
        #: the stream wing: producers, consumers, streams and super streams, their topology and placement
        self.streams = StreamWing(self.settings, entries, srv=srv, placement=placement, recovery=recovery,
                                  batching=batching, pool=pool, management=management, telemetry=telemetry,
                                  instruments=self.instruments)
        self._hooks: list[Callable[[RecoveryEvent], Any]] = []
        self.streams.on_recovery = self._recovered
        self._amqp: AmqpPlacer | None = None
        self._amqp10: Amqp10Placer | None = None
        self._mqtt: MqttPlacer | None = None
        self._mqtt_placers: weakref.WeakSet[MqttPlacer] = weakref.WeakSet()
        #: the nodes found cut off lately, shared by the AMQP 0.9.1, AMQP 1.0 and MQTT wings: what one finds (its
        #: queues take nothing there), the others' connections there leave, and their new ones avoid
        self.cut_off = CutOffNodes()

    def __repr__(self) -> str:
        return (f"Environment(entry_points={[str(a) for a in self.streams.entry_points]}, "
                f"user={self.settings.credentials.username!r}, resolver={self.settings.resolver!r})")

    # -- what the wings share -------------------------------------------------------------------------------
    @property
    def management(self) -> ManagementClient | None:
        """The management API client every wing asks (AMQP and MQTT nodes, older brokers' super streams)."""
        return self._management

    @management.setter
    def management(self, value: ManagementClient | None) -> None:
        self._management = value
        self.streams.management = value

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: every call but ``close()`` then raises :class:`HandleClosed`."""
        return self.streams.closed

    def _check_open(self) -> None:
        if self.closed:
            raise HandleClosed(f"{self!r} is closed")

    def _measured(self, placer: P) -> P:
        """``placer`` (an AMQP or MQTT placer of this Environment) measured with the telemetry's metrics, its
        recoveries told to the recovery hooks, the nodes found cut off shared with the other wings."""
        placer.cut_off = self.cut_off
        if isinstance(placer, RecoveryReporting):
            placer.on_recovery = self._recovered
        if self.instruments is not None:
            self.instruments.watch(placer)
        return placer

    def on_recovery(self, hook: Callable[[RecoveryEvent], Any]) -> Callable[[], None]:
        """Tell ``hook`` of every recovery that ends, of every wing: a :class:`RecoveryEvent` (the handle, the node
        before and after, the cause, the seconds it took, its attempts, its failure if it gave up), on the thread
        that recovered (the event loop for streams; the client's own thread for AMQP 1.0 and MQTT).  aio-pika's
        ``reconnect_callbacks`` are the model.  Returns a function that removes the hook.  A hook that raises is
        logged; the recovery is not affected.  A closed Environment refuses (:class:`HandleClosed`)."""
        self._check_open()
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    def _recovered(self, event: RecoveryEvent) -> None:
        if self.instruments is not None:
            self.instruments.recovered(event)
        for hook in list(self._hooks):
            try:
                hook(event)
            except Exception:  # the application's hook: the recovery goes on
                log.exception("the recovery hook %r raised on %r", hook, event)

    # -- lifecycle -----------------------------------------------------------------------------------------
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
        await self.streams.start()

    async def close(self) -> None:
        """Close every producer, consumer and stream connection, and stop handing new tokens to the AMQP connections
        and MQTT clients (they are the application's to close; each lasts until its token expires)."""
        for placer in (self._amqp, self._amqp10, *list(self._mqtt_placers)):
            if placer is not None:
                placer.close()
        try:
            await self.streams.close()
        finally:
            if self.instruments is not None:
                self.instruments.close()

    # -- streams ---------------------------------------------------------------------------------------------
    async def topology(self, stream: str) -> StreamTopology:
        """The stream's leader and replicas (advertised addresses, and where each is dialled), from the cache or
        the broker.

        :raises StreamNotFound: the stream does not exist.
        :raises TopologyError: it has no leader within a few seconds.
        """
        return await self.streams.topology(stream)

    def placements(self) -> list[PlacementRecord]:
        """Where every live producer and consumer sits: role, stream, node reported, address dialled."""
        return self.streams.placements()

    async def producer(self, stream: str, *, options: ProducerOptions | None = None, name: str | None = None,
                       filter_value: Callable[[Any], str | None] | None = None, batching: BatchingPolicy | None = None,
                       encoding: str = "amqp") -> Producer:
        """A producer on ``stream``, connected to its leader (see :class:`PlacementPolicy`).

        ``options`` (a :class:`ProducerOptions`), or its fields as keywords (not both): ``name`` (for
        deduplication), ``filter_value``, ``batching`` (default: the Environment's) and ``encoding`` (``"amqp"`` or
        ``"raw"``); see :class:`ProducerOptions`.

        :raises ConfigurationError: a bad name, ``filter_value`` or ``encoding``, or both ``options`` and keywords
            (before any I/O).
        :raises FeatureNotSupported: ``filter_value`` on a broker without filtering.
        :raises StreamNotFound: the stream does not exist.
        :raises PlacementError: the leader could not be reached within the retry policy.
        """
        chosen = given_options(ProducerOptions, options, name=name, filter_value=filter_value, batching=batching,
                               encoding=encoding)
        return await self.streams.producer(stream, chosen)

    async def consumer(
        self,
        stream: str,
        callback: Callable[[Any, Any], Awaitable[None] | None] | None = None,
        *,
        on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
        options: ConsumerOptions | None = None,
        offset: OffsetSpec | str | int | datetime.datetime = "next",
        name: str | None = None,
        single_active: bool = False,
        on_update: Callable[[bool, Consumer], Awaitable[OffsetSpec] | OffsetSpec] | None = None,
        tracking: OffsetTracking | None = None,
        filter: StreamFilter | None = None,
        flow: ConsumerFlow | None = None,
        on_error: OnError = "stop",
    ) -> Consumer:
        """A consumer on ``stream``, connected to a replica (spread over the replicas; leader as fallback).

        :param callback: called with each message (``bytes``) and its :class:`MessageContext`; or
        :param on_chunk: called with each :class:`Chunk` instead (its offsets, its bodies split when asked for,
            decoded on demand): one call per chunk, for code that works on batches.  Give one of the two.
        :param options: a :class:`ConsumerOptions`, or its fields as keywords (not both): ``offset``, ``name``,
            ``single_active``, ``on_update``, ``tracking``, ``filter``, ``flow``, ``on_error``.
        :raises FeatureNotSupported: ``filter`` on a broker without filtering.
        :raises ConfigurationError: a bad offset, tracking or single active without a name, or both ``options``
            and keywords.
        :raises NoCandidateNode: replicas are forced and the stream has none.
        :raises PlacementError: no acceptable node could be reached within the retry policy.
        """
        chosen = given_options(ConsumerOptions, options, offset=offset, name=name, single_active=single_active,
                               on_update=on_update, tracking=tracking, filter=filter, flow=flow, on_error=on_error)
        return await self.streams.consumer(stream, callback, on_chunk=on_chunk, options=chosen)

    async def super_stream_producer(self, super_stream: str, *, routing: str = "hash",
                                    key: Callable[[Any], str] | None = None, options: ProducerOptions | None = None,
                                    name: str | None = None, encoding: str = "amqp") -> SuperStreamProducer:
        """A producer on every partition of ``super_stream``, each on its partition's leader.

        :param routing: ``"hash"`` (murmur3, compatible with the Java/Go/JS clients) or ``"key"`` (the
            broker's bindings, through the Route command).
        :param key: extracts the routing key from a message (or pass ``key=`` to ``send``).
        :param options: every partition's :class:`ProducerOptions`, or ``name`` (the same on every partition, for
            deduplication) and ``encoding`` as keywords.
        """
        chosen = given_options(ProducerOptions, options, name=name, encoding=encoding)
        return await self.streams.super_stream_producer(super_stream, routing=routing, key=key, options=chosen)

    async def super_stream_consumer(self, super_stream: str,
                                    callback: Callable[[Any, Any], Awaitable[None] | None] | None = None, *,
                                    on_chunk: Callable[[Chunk], Awaitable[None] | None] | None = None,
                                    options: ConsumerOptions | None = None,
                                    offset: OffsetSpec | str | int | datetime.datetime = "next",
                                    name: str | None = None, single_active: bool = False,
                                    flow: ConsumerFlow | None = None) -> SuperStreamConsumer:
        """A consumer on every partition, with a ``callback`` per message or ``on_chunk`` per chunk (see
        :meth:`consumer`): each with ``options`` (a :class:`ConsumerOptions`, for tracking, ``on_error``...), or
        ``offset``, ``name``, ``single_active`` and ``flow`` as keywords.  With ``name`` and ``single_active``, the
        broker keeps one active consumer per partition across every instance of the name, and fails over between
        them."""
        chosen = given_options(ConsumerOptions, options, offset=offset, name=name, single_active=single_active,
                               flow=flow)
        return await self.streams.super_stream_consumer(super_stream, callback, on_chunk=on_chunk, options=chosen)

    async def create_stream(self, stream: str, arguments: StreamArguments | Mapping[str, Any] | None = None,
                            exists_ok: bool = False) -> None:
        """Create a stream.  Arguments are validated first (:class:`StreamArguments`); unknown keys, which
        the broker would silently ignore, are refused.

        :raises ConfigurationError: a bad name or argument; nothing was sent.
        :raises TopologyError: the stream exists and ``exists_ok`` is False; or it exists with other
            arguments (whatever ``exists_ok`` says): the message names those that differ, when the
            Environment has a management client to read them.
        """
        await self.streams.create_stream(stream, arguments, exists_ok)

    async def delete_stream(self, stream: str, missing_ok: bool = False) -> None:
        """Delete ``stream``.  This Environment's producers and consumers of it close quietly first: no
        recovery, no warning; their ``failure`` says why and their pending messages fail with that reason.

        :raises StreamNotFound: the stream does not exist and ``missing_ok`` is False.
        """
        await self.streams.delete_stream(stream, missing_ok)

    async def create_super_stream(self, super_stream: str, *, partitions: int | None = None,
                                  binding_keys: Sequence[str] | None = None,
                                  arguments: StreamArguments | Mapping[str, Any] | None = None,
                                  exists_ok: bool = False, management: ManagementClient | None = None) -> list[str]:
        """Create a super stream of ``partitions`` numbered partitions, or one per binding key; return the
        partition names.  Uses the CreateSuperStream command where the broker has it (3.13+), and the AMQP
        topology (exchange, partition streams, bindings) through the management API otherwise, or when
        ``management`` is given here.

        :raises ConfigurationError: bad names, counts or arguments; nothing was sent.
        :raises TopologyError: it exists and ``exists_ok`` is False.
        :raises FeatureNotSupported: no CreateSuperStream command and no management client.
        """
        return await self.streams.create_super_stream(super_stream, partitions=partitions, binding_keys=binding_keys,
                                                      arguments=arguments, exists_ok=exists_ok, management=management)

    async def delete_super_stream(self, super_stream: str, missing_ok: bool = False) -> None:
        """Delete ``super_stream`` and its partitions; this Environment's producers and consumers of them
        close quietly first (their pending messages fail with the reason).

        :raises StreamNotFound: there is no such super stream and ``missing_ok`` is False.
        """
        await self.streams.delete_super_stream(super_stream, missing_ok)

    async def stored_offset(self, stream: str, name: str) -> int | None:
        """The offset stored on the server for consumer ``name`` on ``stream``, or None if there is none.

        :raises StreamNotFound: the stream does not exist.
        """
        return await self.streams.stored_offset(stream, name)

    async def stream_stats(self, stream: str, *, node: Address | None = None) -> dict[str, int]:
        """The broker's statistics of ``stream`` (StreamStats): ``first_chunk_id``, ``committed_chunk_id``,
        ``last_chunk_id`` and, from RabbitMQ 4.3, ``committed_offset`` (-1 when empty), on a short connection.
        Each member answers with its own view (the leader's is the authority; a replica's trails it by its
        replication): ``node`` asks that member (for example a consumer's ``node``), by default any one.

        :raises StreamNotFound: the stream does not exist.
        :raises TopologyError: ``node`` is not a member of the stream.
        :raises FeatureNotSupported: the broker has no StreamStats command (before 3.11).
        """
        return await self.streams.stream_stats(stream, node=node)

    async def read_arrow(self, stream: str, start: int = 0, end: int | None = None, *,
                         filter: StreamFilter | None = None, settle: float = 1.0,
                         fail_on_data_loss: bool = True, decode: bool = False) -> Any:
        """Offsets ``start`` to ``end`` (exclusive; None: where the stream ends now) of ``stream`` as one
        ``pyarrow.Table``: ``offset``, ``timestamp`` (the chunk's), ``body`` (``binary_view``, over the frames
        read: no body is copied).  Read by a chunk consumer on a replica, with its placement and recovery: every
        offset comes once, in order.  Needs the ``[arrow]`` extra.  See :meth:`iter_arrow`."""
        return await self.streams.read_arrow(stream, start, end, filter=filter, settle=settle,
                                             fail_on_data_loss=fail_on_data_loss, decode=decode)

    def iter_arrow(self, stream: str, start: int = 0, end: int | None = None, *, filter: StreamFilter | None = None,
                   settle: float = 1.0, fail_on_data_loss: bool = True, decode: bool = False) -> AsyncIterator[Any]:
        """The range of :meth:`read_arrow` as ``pyarrow.RecordBatch`` es, one per chunk, as they come: a few
        chunks are read ahead, and the consumer's credit waits while the loop is slow.

        :param filter: only messages with these filter values (see :class:`StreamFilter`): the offsets of the
            others are missing from the batches.
        :param settle: seconds with nothing handed over after which the read checks whether anything is left
            before ``end`` (see :mod:`smartclient.stream.columnar`); a read of offsets not written yet waits for them.
        :param fail_on_data_loss: offsets from ``start`` that retention removed raise :class:`DataLoss` (the
            default), or are skipped with a warning.
        :param decode: each message decoded as an AMQP 1.0 message, with ``properties`` (struct) and
            ``application_properties`` (map) columns (see :meth:`Chunk.to_arrow`).
        :raises ConfigurationError: pyarrow or numpy is missing; a bad ``start``, ``end`` or ``settle``.
        :raises DataLoss: see ``fail_on_data_loss``.
        :raises MessageDecodeError: (``decode``) a message is not an AMQP 1.0 message; it names its offset.
        :raises StreamNotFound: the stream does not exist.
        """
        return self.streams.iter_arrow(stream, start, end, filter=filter, settle=settle,
                                       fail_on_data_loss=fail_on_data_loss, decode=decode)

    # -- AMQP 0.9.1 (pika) and AMQP 1.0 (rabbitmq-amqp-python-client) ---------------------------------------------
    @property
    def amqp(self) -> AmqpPlacer:
        """The AMQP 0.9.1 wing: the :class:`AmqpPlacer` of this Environment (its settings; the nodes' ``amqp/ssl``
        listeners when the Environment uses TLS; through the load balancer's AMQP listener when the resolver is
        one).  With token credentials every connection it handed out takes each new token.

        :raises ConfigurationError: no management API was given (AMQP needs it to find nodes), or the resolver is
            a load balancer without an AMQP listener.
        """
        self._check_open()
        from smartclient.amqp.placement import AmqpPlacer

        if self.management is None:
            raise ConfigurationError(
                "AMQP placement needs the management API (it lists the nodes' AMQP listeners and says which node "
                "a connection reached): Environment(..., management=ManagementClient(url, user, password))")
        if self._amqp is None:
            self._amqp = self._measured(AmqpPlacer(self.management, settings=self.settings))
        return self._amqp

    def amqp_connection(self, node: str | None = None) -> PlacedConnection:
        """A pika ``BlockingConnection`` on ``node`` (full name or short name; any node if None), through the
        resolver (or the load balancer's AMQP listener), checked with the management API.

        :raises NoCandidateNode: no such node.  :raises NodeUnreachable: the LB never reached it.
        :raises AuthenticationFailed: refused credentials (:class:`TokenExpired` for a token past its expiry).
        :raises TokenProviderFailed: the token provider failed (it is asked again only after its back-off).
        """
        return self.amqp.connect(node)

    @property
    def amqp10(self) -> Amqp10Placer:
        """The AMQP 1.0 wing: the :class:`~smartclient.amqp10.placement.Amqp10Placer` of this Environment (its
        settings and recovery policy; the management API, if given, for the nodes' listeners): through the load
        balancer's AMQP listener when the resolver is one, each connection checked by the node its Open frame
        names.  With tokens, each new one is handed to its live connections.  Needs the ``[amqp10]`` extra."""
        self._check_open()
        from smartclient.amqp10.placement import Amqp10Placer

        if self._amqp10 is None:
            self._amqp10 = self._measured(Amqp10Placer(
                self.management, settings=self.settings, recovery=self.recovery,
                tracer_provider=self.telemetry.tracer_provider))
        return self._amqp10

    # -- MQTT (paho-mqtt) ------------------------------------------------------------------------------------
    @property
    def mqtt(self) -> MqttPlacer:
        """The MQTT wing: this Environment's :class:`MqttPlacer` with the default :class:`MqttOptions` (see
        :meth:`mqtt_placer` for others)."""
        if self._mqtt is None:
            self._mqtt = self.mqtt_placer()
        return self._mqtt

    def mqtt_placer(self, *, entry_points: Any = None, options: MqttOptions | None = None,
                    tls: ssl.SSLContext | bool | None = None) -> MqttPlacer:
        """A new :class:`MqttPlacer` with this Environment's settings; through the load balancer's MQTT listener
        when the resolver is one (``LoadBalancer(..., mqtt=PORT, mqtt_tls=PORT)``), every client checked.  With
        token credentials its clients hand over to each new token (:mod:`smartclient.mqtt.handover`).

        :param entry_points: MQTT listeners (``host:port``, ``mqtt://host:port``) or a
            :class:`resolvers.SrvDiscovery` (``_mqtt._tcp.<domain>``), instead of the management API's list.
        :param options: how each connection is opened (default :class:`MqttOptions`).
        :param tls: None: TLS if this Environment uses TLS (the nodes' ``mqtt/ssl`` listeners); False: no
            TLS; or an ``ssl.SSLContext``.
        :raises ConfigurationError: no way to find the nodes (no management API, no entry points, no load
            balancer), or the resolver is a load balancer without a listener for MQTT (or MQTT over TLS), or
            EXTERNAL (a client certificate) without TLS.
        """
        self._check_open()
        from smartclient.mqtt.placement import MqttOptions, MqttPlacer

        context = self.settings.tls if tls is None or tls is True else (tls or None)
        if tls is True and context is None:
            context = ssl.create_default_context()
        if context is None and isinstance(self.settings.credentials, ExternalLogin):
            raise ConfigurationError("MQTT with a client certificate as the identity (EXTERNAL) needs TLS: leave "
                                     "mqtt_placer(tls=) out, or give an ssl.SSLContext")
        certificate = self.settings.client_certificate if context is not None else None
        mqtt = replace(self.settings, tls=context, client_certificate=certificate)
        placer = self._measured(MqttPlacer(self.management, settings=mqtt,
                                           entry_points=entry_points,
                                           options=options if options is not None else MqttOptions()))
        self._mqtt_placers.add(placer)
        return placer

    def mqtt_client(self, client_id: str | None = None, node: str | None = None, *, entry_points: Any = None,
                    options: MqttOptions | None = None, subscriptions: Sequence[tuple[str, int]] = (),
                    setup: Callable[[PlacedMqttClient], None] | None = None, start: bool = True) -> PlacedMqttClient:
        """A connected paho client (:class:`PlacedMqttClient`) on ``node`` (any node if None), that fails
        over to the next node when its connection drops: see :meth:`MqttPlacer.connect`; ``entry_points`` and
        ``options`` as for :meth:`mqtt_placer` (none: :attr:`mqtt`'s).

        :raises NoCandidateNode: no such node.  :raises NodeUnreachable: the LB never reached it.
        :raises AuthenticationFailed: refused credentials (:class:`TokenExpired` for a token past its expiry).
        :raises TokenProviderFailed: the token provider failed.  :raises ConnectionFailed: no node answered.
        """
        placer = self.mqtt if entry_points is None and options is None else self.mqtt_placer(
            entry_points=entry_points, options=options)
        return placer.connect(client_id, node, subscriptions=subscriptions, setup=setup, start=start)

    def mqtt_fleet(self, size: int, *, entry_points: Any = None, options: MqttOptions | None = None,
                   **fleet: Any) -> MqttFleet:
        """An unstarted :class:`MqttFleet` of ``size`` connections (``with env.mqtt_fleet(1000) as fleet:``)."""
        from smartclient.mqtt.fleet import MqttFleet

        return MqttFleet(self.mqtt_placer(entry_points=entry_points, options=options), size, **fleet)

    # -- federation --------------------------------------------------------------------------------------------
    def federated_broker(self, name: str, amqp_uri: str) -> FederatedBroker:
        """This Environment's cluster as one broker of a federation topology (:mod:`smartclient.federation`): its
        management API and that API's credentials, and its vhost, come from the Environment; ``amqp_uri`` is how
        the *other* brokers reach this one's AMQP listener for their links, which only they can say.

        :raises ConfigurationError: no management API was given, or a bad name or URI (before any I/O).
        """
        self._check_open()
        from smartclient.federation.topology import FederatedBroker

        if self.management is None:
            raise ConfigurationError("a federated broker needs the management API (federation is set up through "
                                     "it): Environment(..., management=ManagementClient(url, user, password))")
        signed_in = self.management.credentials
        return FederatedBroker(name, self.management.base_url, amqp_uri, signed_in.username, signed_in.password,
                               self.settings.vhost)
