"""``Environment``: the entry point of the stream API.  Topology cache, placement, shared connections.

One Environment holds:

* one *locator* connection (metadata queries) to an entry point;
* a topology cache per stream, invalidated by MetadataUpdate frames, by the loss of a connection to a
  member node, and by a node mismatch, with concurrent lookups of one stream sharing one request;
* the :class:`~smartclient.stream.connector.StreamConnector`, the one seam where addresses are resolved,
  allow-listed, dialled and checked;
* the rstream Producers and Consumers that carry the producers and consumers the application asked for.
  Producers of different streams share one rstream Producer, and so its connections per node.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    FeatureNotSupported,
    HandleClosed,
    SmartClientError,
    TopologyError,
)
from smartclient.core.address import Address
from smartclient.core.deadline import attempt, detach, remaining, step
from smartclient.core.filters import StreamFilter
from smartclient.core.offsets import OffsetSpec, OffsetTracking
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import Credentials, PoolLimits, StreamURI, parse_stream_uri
from smartclient.core.stream_arguments import StreamArguments, validate_stream_name
from smartclient.core.topology import Candidates, PlacementPolicy, Role, StreamTopology
from smartclient.management import ManagementClient, ManagementError
from smartclient.stream.connector import Connection, ConnectSettings, StreamConnector
from smartclient.stream.errors import map_stream_errors
from smartclient.stream.publishing import BatchingPolicy

if TYPE_CHECKING:
    from rstream import Consumer as RConsumer
    from rstream import Producer as RProducer
    from rstream.client import Client

    from resolvers import AllowList, ResolverLike, SrvDiscovery
    from smartclient.amqp.placement import AmqpPlacer, PlacedConnection
    from smartclient.mqtt.fleet import MqttFleet
    from smartclient.mqtt.placement import MqttOptions, MqttPlacer, PlacedMqttClient
    from smartclient.stream._rstream import PlacedClientPool
    from smartclient.stream.handles import Consumer, Producer
    from smartclient.stream.super_stream import SuperStreamConsumer, SuperStreamProducer

    EntryPoints = str | Address | Sequence[str | Address] | SrvDiscovery

__all__ = ["Environment", "PlacementRecord"]

log = logging.getLogger(__name__)

TOPOLOGY_TIME = 5.0  # seconds one metadata lookup keeps asking while the stream has no leader (an election)

@dataclass(frozen=True)
class PlacementRecord:
    """Where one producer or consumer landed: for the placement table and for the tests."""

    role: Role
    stream: str
    name: str | None
    node: Address
    dialled: Address
    connection: str

    def row(self) -> str:
        return (f"{self.role.value:<9} {self.stream:<28} {self.name or '-':<16} node {self.node!s:<22} "
                f"via {self.dialled!s:<22} {self.connection}")


class Environment:
    """Connections to a RabbitMQ cluster's streams, each placed on the right node.

    :param entry_points: where to reach the cluster first: one or more ``rabbitmq-stream[+tls]://`` URIs or
        ``host:port`` strings or :class:`Address` values, or a :class:`resolvers.SrvDiscovery`.
    :param username: overrides the URI's user name (default guest).
    :param password: overrides the URI's password (default guest).
    :param vhost: override the URI's vhost (default ``/``).
    :param tls: an ``ssl.SSLContext``; a ``+tls`` URI without one gets ``ssl.create_default_context()``.
    :param resolver: maps advertised node addresses to dialable ones (default :class:`resolvers.Identity`).
    :param placement: producers on the leader, consumers on replicas (see :class:`PlacementPolicy`).
    :param retry: caps and back-off of each placement (see :class:`RetryPolicy`).
    :param allow: an :class:`resolvers.AllowList` checked on every address before it is dialled.
    :param pool: connection sharing and parking limits (see :class:`PoolLimits`).
    :param topology_max_age: seconds a cached topology is trusted without any invalidating event.
    :param batching: how producers batch ``send()`` (see :class:`BatchingPolicy`).
    :param recovery: how producers and consumers recover from a lost connection or a leader move
        (see :class:`RecoveryPolicy`).
    :param tls_server_name: the name every TLS connection verifies (SNI and hostname check), instead of
        the one smartclient works out (the LB's name, or the advertised node name; see smartclient.stream.tls).
    :param management: a :class:`ManagementClient`, for what the stream protocol of an older broker
        cannot do (creating a super stream without the CreateSuperStream command).

    Use it as ``async with Environment(...) as env:``.

    :raises ConfigurationError: bad arguments, before any I/O.
    """

    def __init__(
        self,
        entry_points: EntryPoints,
        *,
        username: str | None = None,
        password: str | None = None,
        vhost: str | None = None,
        tls: ssl.SSLContext | None = None,
        resolver: ResolverLike | None = None,
        placement: PlacementPolicy = PlacementPolicy(),
        retry: RetryPolicy = RetryPolicy(),
        allow: AllowList | None = None,
        pool: PoolLimits = PoolLimits(),
        topology_max_age: float = 60.0,
        connection_name: str = "smartclient",
        frame_max: int = 1024 * 1024,
        heartbeat: int = 60,
        batching: BatchingPolicy = BatchingPolicy(),
        recovery: RecoveryPolicy = RecoveryPolicy(),
        management: ManagementClient | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        from resolvers import Identity, SrvDiscovery
        from resolvers.base import as_async
        from smartclient.core.redaction import install_log_redaction

        install_log_redaction()

        self._srv: SrvDiscovery | None = None
        uris: list[StreamURI] = []
        if isinstance(entry_points, SrvDiscovery):
            self._srv = entry_points
        else:
            items = [entry_points] if isinstance(entry_points, str | Address) else list(entry_points)
            if not items:
                raise ConfigurationError("no entry point given")
            for item in items:
                if isinstance(item, Address):
                    uris.append(StreamURI(item, False, None, None))
                elif "://" in item:
                    uris.append(parse_stream_uri(item))
                else:
                    uris.append(StreamURI(Address.parse(item, default_port=5552), False, None, None))
        creds = {u.credentials for u in uris if u.credentials}
        vhosts = {u.vhost for u in uris if u.vhost is not None}
        if len(creds) > 1 and username is None:
            raise ConfigurationError("the entry-point URIs carry different credentials; pass username/password")
        if len(vhosts) > 1 and vhost is None:
            raise ConfigurationError(f"the entry-point URIs name different vhosts {sorted(vhosts)}; pass vhost=")
        base = next(iter(creds), Credentials())
        credentials = Credentials(username if username is not None else base.username,
                                  password if password is not None else base.password)
        if any(u.tls for u in uris) and tls is None:
            tls = ssl.create_default_context()
        if topology_max_age <= 0:
            raise ConfigurationError(f"topology_max_age must be positive, not {topology_max_age}")
        if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or not 0 <= heartbeat <= 3600:
            raise ConfigurationError(
                f"heartbeat must be a whole number of seconds from 0 (off) to 3600, not {heartbeat!r}")
        if isinstance(frame_max, bool) or not isinstance(frame_max, int) or not 8192 <= frame_max <= 2**31 - 1:
            raise ConfigurationError(f"frame_max must be an int from 8192 to 2**31-1 bytes, not {frame_max!r}")
        if not isinstance(connection_name, str) or not connection_name:
            raise ConfigurationError(f"connection_name must be a non-empty str, not {connection_name!r}")
        self.entry_points = tuple(u.address for u in uris)
        self.settings = ConnectSettings(credentials, vhost if vhost is not None else next(iter(vhosts), "/"),
                                        tls, frame_max, heartbeat, tls_server_name)
        self.resolver = resolver if resolver is not None else Identity()
        self.placement = placement
        self.retry = retry
        self.batching = batching
        self.recovery = recovery
        # one placement attempt during a recovery: short, so that a stale leader is looked up again soon
        self._recovery_retry = RetryPolicy(
            max_attempts=retry.max_attempts, max_time=min(retry.max_time, recovery.attempt_time),
            sticky_window=retry.sticky_window, backoff_initial=retry.backoff_initial,
            backoff_max=min(retry.backoff_max, recovery.attempt_time), backoff_factor=retry.backoff_factor,
        )
        self._recovering: set[tuple[Role, str]] = set()
        self._shared: dict[Role, list[Connection]] = {Role.PRODUCER: [], Role.CONSUMER: []}
        self.connection_name = connection_name
        self.topology_max_age = topology_max_age
        self.connector = StreamConnector(
            self.settings, as_async(self.resolver), allow=allow, retry=retry, limits=pool,
            on_closed=self._on_connection_closed, on_mismatch=self._on_mismatch, resolver=self.resolver,
        )
        self._topologies: dict[str, StreamTopology] = {}
        self._inflight: dict[str, asyncio.Task[StreamTopology]] = {}
        self._locator: Client | None = None
        self._locator_lock = asyncio.Lock()
        self._records: dict[tuple[int, str], PlacementRecord] = {}
        self._rproducers: list[tuple[RProducer, set[str]]] = []
        self._rconsumers: list[tuple[RConsumer, set[str]]] = []
        self._handles: list[Producer | Consumer] = []
        self._commands: dict[int, tuple[int, int]] | None = None
        self.management = management
        self._amqp_placers: dict[str, AmqpPlacer] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._closed = False

    def __repr__(self) -> str:
        return (f"Environment(entry_points={[str(a) for a in self.entry_points]}, "
                f"user={self.settings.credentials.username!r}, resolver={self.resolver!r})")

    # -- lifecycle -----------------------------------------------------------------------------
    async def __aenter__(self) -> Environment:
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
            await self._locator_client()

    async def close(self) -> None:
        """Close every producer, consumer and connection of this Environment."""
        if self._closed:
            return
        self._closed = True
        for handle in list(self._handles):
            try:
                await handle.close()
            except SmartClientError as exc:
                log.debug("closing %r: %s", handle, exc)
        for rproducer, _ in self._rproducers:
            await rproducer.close()
        for rconsumer, _ in self._rconsumers:
            await rconsumer.close()
        if self._locator is not None:
            from smartclient.stream._rstream import LocatorClient

            if isinstance(self._locator, LocatorClient):
                await self._locator.shutdown()
        await self.connector.close()

    async def _entry_points(self) -> tuple[Address, ...]:
        if self._srv is not None:
            return tuple(await self._srv.discover())
        return self.entry_points

    async def _locator_client(self) -> Client:
        async with self._locator_lock:
            if self._locator is not None and self._locator.is_connection_alive():
                return self._locator
            from smartclient.stream._rstream import LocatorClient

            errors = []
            for entry in await self._entry_points():
                try:
                    conn = await self.connector.dial(entry, f"{self.connection_name}-locator", LocatorClient)
                except (AuthenticationFailed, CertificateRejected):
                    raise  # the same credentials (or name) would fail on every entry point: say so, typed
                except ConnectionFailed as exc:
                    errors.append(f"{entry}: {exc}")
                    continue
                self.connector.connections.discard(conn)  # owned here, not by a producer or consumer
                self._locator = conn.client
                return conn.client
            raise ConnectionFailed("no entry point could be reached: " + "; ".join(errors))

    # -- topology ------------------------------------------------------------------------------
    async def topology(self, stream: str) -> StreamTopology:
        """The stream's leader and replicas (advertised addresses), from the cache or the broker.

        :raises StreamNotFound: the stream does not exist.
        :raises TopologyError: it has no leader within a few seconds.
        """
        self._check_open()
        cached = self._topologies.get(stream)
        if cached is not None and time.monotonic() - cached.read_at < self.topology_max_age:
            return cached
        task = self._inflight.get(stream)
        if task is None:
            task = asyncio.create_task(self._query_topology(stream))
            self._inflight[stream] = task
            task.add_done_callback(lambda _t: self._inflight.pop(stream, None))
        return await step(f"reading the topology of {stream!r}", asyncio.shield(task))

    async def _query_topology(self, stream: str) -> StreamTopology:
        from rstream.exceptions import LeaderNotAvailable

        # shared by every placement that asks meanwhile: bounded on its own (each asker bounds its wait)
        detach()
        deadline = time.monotonic() + TOPOLOGY_TIME
        while True:
            locator = await self._locator_client()
            try:
                with map_stream_errors(f"reading the topology of {stream!r}"):
                    try:
                        leader, replicas = await step("metadata query", locator.query_leader_and_replicas(stream),
                                                      default=TOPOLOGY_TIME)
                    except LeaderNotAvailable:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.1)
                        continue
            except ConnectionFailed:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            members = [Address(leader.host, leader.port), *(Address(r.host, r.port) for r in replicas)]
            dial: dict[Address, Address | str] = {}
            for member in members:
                try:
                    dial[member] = await self.connector.resolve(member)
                except SmartClientError as exc:  # reported per node; placement raises it if it needs the node
                    dial[member] = f"{type(exc).__name__}: {exc}"
            topo = StreamTopology(stream, members[0], tuple(members[1:]), dial=dial)
            self._topologies[stream] = topo
            return topo

    def invalidate(self, stream: str | None = None, node: Address | None = None) -> None:
        """Forget cached topologies: one stream's, those with a member on ``node``, or all."""
        self._check_open()
        self._drop_topologies(stream, node)

    def _drop_topologies(self, stream: str | None = None, node: Address | None = None) -> None:
        for name, topo in list(self._topologies.items()):
            if (stream is None and node is None) or name == stream or (node is not None and node in topo.members):
                del self._topologies[name]

    async def _on_metadata_update(self, frame: Any) -> None:
        stream = frame.metadata_info.stream
        log.info("MetadataUpdate for %s: topology invalidated", stream)
        self._drop_topologies(stream=stream)

    async def _on_connection_closed(self, conn: Connection, info: Any) -> None:
        log.info("connection %s to %s closed: topologies with that node invalidated", conn.name, conn.node)
        self._drop_topologies(node=conn.node)
        for key, record in list(self._records.items()):
            if record.connection == conn.name:
                del self._records[key]

    def _on_mismatch(self, target: Address, reached: Address, candidates: Candidates) -> None:
        self._drop_topologies(node=target)
        self._drop_topologies(stream=candidates.stream)

    # -- placement -------------------------------------------------------------------------------
    async def candidates(self, stream: str, role: Role) -> Candidates:
        """The nodes a producer or consumer of ``stream`` may use, by tier (see :class:`Candidates`)."""
        self._check_open()
        topo = await self.topology(stream)
        if role is Role.CONSUMER and not topo.replicas:
            # A new stream's replicas come up a moment after its leader: look again before falling back.
            wait = self.retry.max_time if self.placement.force_replica_for_consumers else 1.0
            deadline = time.monotonic() + min(wait, remaining(wait))
            while not topo.replicas and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                self._drop_topologies(stream=stream)
                topo = await self.topology(stream)
        return topo.candidates(role, self.placement, self._consumer_load(stream))

    def _consumer_load(self, stream: str) -> Counter[Address]:
        return Counter(r.node for r in self._records.values() if r.role is Role.CONSUMER and r.stream == stream)

    async def _place(self, pool: PlacedClientPool, stream: str, closed_handler: Any) -> Connection:
        """A connection for ``stream`` on a node of its candidates: a shared one of this role on a tier-0 node
        with a free id (so the connections grow with the nodes, not with the producers or consumers), or a
        new one from the connector."""
        from rstream import schema

        from smartclient.stream._rstream import closed_forwarder

        role = pool.role
        candidates = await self.candidates(stream, role)
        shared = self._shared[role]
        shared[:] = [c for c in shared if c.alive()]
        conn = next((c for c in shared if c.node in candidates.tiers[0] and c.has_room()), None)
        if conn is None:
            retry = self._recovery_retry if (role, stream) in self._recovering else None
            conn = await self.connector.acquire(candidates, self.connection_name, retry=retry)
            conn.client.add_handler(schema.MetadataUpdate, self._on_metadata_update, name="smartclient-topology")
            if conn.alive() and all(c is not conn for c in shared):
                shared.append(conn)
        conn.forwards[id(pool.carrier)] = closed_forwarder(pool.carrier, conn.client, closed_handler)
        conn.client.add_stream(stream)
        name = pool.names.get(stream)
        self._records[(id(pool), stream)] = PlacementRecord(role, stream, name, conn.node, conn.dialled, conn.name)
        return conn

    async def _unused(self, conn: Connection) -> None:
        """No producer or consumer uses ``conn`` any more: park it, for the next placement on its node (it
        closes after ``PoolLimits.idle_timeout``)."""
        for shared in self._shared.values():
            if conn in shared:
                shared.remove(conn)
        await self.connector.park(conn)

    def placement_of(self, pool: PlacedClientPool, stream: str) -> PlacementRecord | None:
        """Where the producer or consumer of ``stream`` on the carrier of ``pool`` sits (see ``Producer.placement``)."""
        self._check_open()
        return self._placement_of(pool, stream)

    def _placement_of(self, pool: PlacedClientPool, stream: str) -> PlacementRecord | None:
        return self._records.get((id(pool), stream))

    def placements(self) -> list[PlacementRecord]:
        """Where every live producer and consumer sits: role, stream, node reported, address dialled."""
        self._check_open()
        return sorted(self._records.values(), key=lambda r: (r.role.value, r.stream, r.connection))

    # -- producers and consumers -------------------------------------------------------------------
    def _rstream_kwargs(self) -> dict[str, Any]:
        entry = self.entry_points[0] if self.entry_points else Address("srv-discovered", 5552)
        creds = self.settings.credentials
        return dict(host=entry.host, port=entry.port, username=creds.username, password=creds.password,
                    vhost=self.settings.vhost, ssl_context=self.settings.tls, frame_max=self.settings.frame_max,
                    heartbeat=self.settings.heartbeat)

    def _carrier(self, role: Role, stream: str) -> Any:
        """An rstream Producer/Consumer with no publisher/subscriber on ``stream`` yet (made if needed)."""
        from smartclient.stream._rstream import PlacedClientPool, PlacedConsumer, PlacedProducer

        carriers: list[Any] = self._rproducers if role is Role.PRODUCER else self._rconsumers
        for carrier, streams in carriers:
            if stream not in streams:
                streams.add(stream)
                return carrier
        kwargs = self._rstream_kwargs()
        if role is Role.PRODUCER:
            carrier = PlacedProducer(**kwargs, connection_name=f"{self.connection_name}-producer",
                                max_publishers_by_connection=self.connector.limits.max_streams_per_connection)
        else:
            carrier = PlacedConsumer(**kwargs, connection_name=f"{self.connection_name}-consumer",
                                max_subscribers_by_connection=self.connector.limits.max_streams_per_connection)
        carrier._pool = PlacedClientPool(self, role, carrier)
        carrier.smartclient_env = self
        carriers.append((carrier, {stream}))
        return carrier

    def _lost(self, role: Role, carrier: Any, stream: str, reason: str) -> None:
        """rstream says the publisher or subscriber of ``stream`` on ``carrier`` is gone: hand it over."""
        for handle in self._handles:
            if handle.role is role and handle._carrier is carrier and handle.stream == stream:
                handle._lost(reason)
                return
        # nobody to hand it to (closed meanwhile): still clear rstream's state, or the next producer or
        # consumer of this stream on this carrier would get the dead connection
        from smartclient.stream._rstream import forget_publisher, forget_subscriber

        log.debug("%s of %s lost (%s), but it is not open any more", role.value, stream, reason)
        forget = forget_publisher if role is Role.PRODUCER else forget_subscriber
        task = asyncio.ensure_future(forget(carrier, stream, dead_only=True))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _release(self, role: Role, carrier: Any, stream: str) -> None:
        carriers: list[Any] = self._rproducers if role is Role.PRODUCER else self._rconsumers
        for other, streams in carriers:
            if other is carrier:
                streams.discard(stream)
        self._records.pop((id(carrier._pool), stream), None)

    async def producer(self, stream: str, *, name: str | None = None,
                       filter_value: Callable[[Any], str] | None = None,
                       batching: BatchingPolicy | None = None) -> Producer:
        """A producer on ``stream``, connected to its leader (see :class:`PlacementPolicy`).

        :param name: producer name, for deduplication (unique per stream).
        :param filter_value: returns the filter value of a message (its body, as given to ``send``),
            for consumers with a :class:`StreamFilter`.
        :param batching: how ``send()`` batches (default: the Environment's :class:`BatchingPolicy`).
        :raises FeatureNotSupported: ``filter_value`` on a broker without filtering.
        :raises StreamNotFound: the stream does not exist.
        :raises PlacementError: the leader could not be reached within the retry policy.
        """
        from smartclient.stream.handles import Producer

        self._check_open()
        validate_stream_name(stream)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigurationError(f"a producer name must be a non-empty str or None, not {name!r}")
        if filter_value is not None and not callable(filter_value):
            raise ConfigurationError(f"filter_value of a producer on {stream!r} must be callable, not {filter_value!r}")
        if filter_value is not None:
            await self.require_filtering()
        carrier = self._carrier(Role.PRODUCER, stream)
        carrier._pool.names[stream] = name
        handle = Producer(self, carrier, stream, name)
        self._handles.append(handle)  # from now on, a loss is handed to it (see _lost)
        try:
            with attempt(self.retry.max_time, f"placing the producer of {stream!r}") as deadline:
                await handle._place(batching or self.batching, filter_value)
            log.debug("%r placed: %s", handle, deadline.log())
        except BaseException:
            self._forget(handle)
            self._release(Role.PRODUCER, carrier, stream)
            raise
        return handle

    async def consumer(
        self,
        stream: str,
        callback: Callable[[Any, Any], Awaitable[None] | None],
        *,
        offset: OffsetSpec | str | int | datetime.datetime = "next",
        name: str | None = None,
        single_active: bool = False,
        on_update: Callable[[bool, Consumer], Awaitable[OffsetSpec] | OffsetSpec] | None = None,
        tracking: OffsetTracking | None = None,
        filter: StreamFilter | None = None,
        _super_stream: str | None = None,
    ) -> Consumer:
        """A consumer on ``stream``, connected to a replica (spread over the replicas; leader as fallback).

        :param callback: called with each message and its context.
        :param offset: an :class:`OffsetSpec`, or ``"first"``, ``"last"``, ``"next"``, an absolute offset,
            a ``datetime`` or an interval such as ``"1h"``.
        :param name: consumer name: needed for offset tracking and single active consumer.
        :param single_active: one instance of ``name`` receives at a time; another takes over on failure.
        :param on_update: for a single active consumer, called with ``(is_active, consumer)`` when it
            becomes active (or not); returns where to resume.  Default: after the stored offset, else
            ``offset``.
        :param tracking: store the offset on the server automatically (see :class:`OffsetTracking`).
        :param filter: only messages with these filter values (see :class:`StreamFilter`).
        :raises FeatureNotSupported: ``filter`` on a broker without filtering.
        :raises ConfigurationError: a bad offset, or tracking or single active without a name.
        :raises NoCandidateNode: replicas are forced and the stream has none.
        :raises PlacementError: no acceptable node could be reached within the retry policy.
        """
        from smartclient.stream.handles import Consumer

        self._check_open()
        validate_stream_name(stream)
        if not callable(callback):
            raise ConfigurationError(
                f"the callback of a consumer on {stream!r} must be callable (message, context), not {callback!r}")
        spec = OffsetSpec.parse(offset)  # bad input fails here, before any I/O
        if (single_active or tracking is not None) and not name:
            raise ConfigurationError(
                f"a consumer on {stream!r} with single_active or offset tracking needs a name"
            )
        if filter is not None:
            await self.require_filtering()
        carrier = self._carrier(Role.CONSUMER, stream)
        carrier._pool.names[stream] = name
        handle = Consumer(self, carrier, stream, name)
        self._handles.append(handle)
        try:
            with attempt(self.retry.max_time, f"placing the consumer of {stream!r}") as deadline:
                await handle._subscribe(callback, spec, single_active=single_active, on_update=on_update,
                                        tracking=tracking, super_stream=_super_stream, stream_filter=filter)
            log.debug("%r placed: %s", handle, deadline.log())
        except BaseException:
            self._forget(handle)
            self._release(Role.CONSUMER, carrier, stream)
            raise
        return handle

    async def command_versions(self) -> dict[int, tuple[int, int]]:
        """The broker's stream commands: ``{key: (min_version, max_version)}`` (asked once, then cached)."""
        self._check_open()
        from rstream import schema

        if self._commands is None:
            locator = await self._locator_client()
            ours = [schema.FrameHandlerInfo(2, 1, 2)]  # what we speak is not what matters here
            with map_stream_errors("asking the broker which commands it supports"):
                response = await locator.sync_request(
                    schema.ExchangeCommandVersionRequest(locator._corr_id_seq.next(), command_versions=ours),
                    resp_schema=schema.ExchangeCommandVersionResponse, raise_exception=False,
                )
            self._commands = {c.key_command: (c.min_version, c.max_version) for c in response.command_versions}
        return self._commands

    async def require_filtering(self) -> None:
        """:raises FeatureNotSupported: the broker has no filtering (Publish v2, RabbitMQ 3.13+)."""
        self._check_open()
        if (await self.command_versions()).get(2, (1, 1))[1] < 2:
            raise FeatureNotSupported(
                "the broker does not support stream filtering (Publish v2): it needs RabbitMQ 3.13+ with the "
                "stream_filtering feature flag enabled"
            )

    def _forget(self, handle: Producer | Consumer) -> None:
        if handle in self._handles:
            self._handles.remove(handle)

    def _check_open(self) -> None:
        if self._closed:
            raise HandleClosed(f"{self!r} is closed")

    # -- AMQP 0.9.1 (pika) ------------------------------------------------------------------------
    def amqp_placer(self, *, via: str | Address | None = None) -> AmqpPlacer:
        """An :class:`AmqpPlacer` with this Environment's credentials, vhost, resolver, allow-list and retry
        policy.  ``via``: a load balancer's AMQP address (connections go through it and are checked).

        :raises ConfigurationError: no management API was given (AMQP needs it to find nodes), or the
            resolver is a stream load balancer and ``via`` is missing.
        """
        self._check_open()
        from resolvers import LoadBalancer
        from smartclient.amqp.placement import AmqpPlacer

        if self.management is None:
            raise ConfigurationError(
                "AMQP placement needs the management API (it lists the nodes' AMQP listeners and says which node "
                "a connection reached): Environment(..., management=ManagementClient(url, user, password))"
            )
        if via is None and isinstance(self.resolver, LoadBalancer):
            raise ConfigurationError(
                f"the resolver sends every address to the stream load balancer {self.resolver.address}; "
                f"pass via= the load balancer's AMQP address"
            )
        key = str(via)
        placer = self._amqp_placers.get(key)
        if placer is None:
            placer = AmqpPlacer(
                self.management, credentials=self.settings.credentials, vhost=self.settings.vhost,
                resolver=self.resolver, allow=self.connector.allow, retry=self.retry, tls=self.settings.tls,
                connection_name=self.connection_name, via=via,
            )
            self._amqp_placers[key] = placer
        return placer

    def amqp_connection(self, node: str | None = None, *, via: str | Address | None = None) -> PlacedConnection:
        """A pika ``BlockingConnection`` on ``node`` (full name or short name; any node if None), directly
        through the resolver or through the load balancer ``via``, checked with the management API.

        :raises NoCandidateNode: no such node.  :raises NodeUnreachable: the LB never reached it.
        """
        return self.amqp_placer(via=via).connect(node)

    # -- MQTT (paho-mqtt) --------------------------------------------------------------------------
    def mqtt_placer(
        self,
        *,
        via: str | Address | None = None,
        entry_points: Any = None,
        options: MqttOptions | None = None,
        tls: ssl.SSLContext | bool | None = None,
    ) -> MqttPlacer:
        """An :class:`MqttPlacer` with this Environment's credentials, vhost, resolver, allow-list, retry
        policy and TLS name rules.

        :param via: a load balancer's MQTT address; every client goes through it (checked with the
            management API when a node is asked for, and by fleets).
        :param entry_points: MQTT listeners (``host:port``, ``mqtt://host:port``) or a
            :class:`resolvers.SrvDiscovery` (``_mqtt._tcp.<domain>``), instead of the management API's list.
        :param tls: None: TLS if this Environment uses TLS (the nodes' ``mqtt/ssl`` listeners); False: no
            TLS; or an ``ssl.SSLContext``.
        :raises ConfigurationError: no way to find the nodes (no management API, no entry points, no
            ``via``), or the resolver is a stream load balancer and ``via`` is missing.
        """
        self._check_open()
        from resolvers import LoadBalancer
        from smartclient.mqtt.placement import MqttOptions, MqttPlacer

        if via is None and isinstance(self.resolver, LoadBalancer):
            raise ConfigurationError(
                f"the resolver sends every address to the stream load balancer {self.resolver.address}; "
                f"pass via= the load balancer's MQTT address"
            )
        context = self.settings.tls if tls is None or tls is True else (tls or None)
        if tls is True and context is None:
            context = ssl.create_default_context()
        return MqttPlacer(
            self.management, credentials=self.settings.credentials, vhost=self.settings.vhost,
            resolver=self.resolver, allow=self.connector.allow, retry=self.retry, tls=context,
            tls_server_name=self.settings.tls_server_name, via=via, entry_points=entry_points,
            options=options if options is not None else MqttOptions(),
        )

    def mqtt_client(
        self,
        client_id: str | None = None,
        node: str | None = None,
        *,
        via: str | Address | None = None,
        entry_points: Any = None,
        options: MqttOptions | None = None,
        subscriptions: Sequence[tuple[str, int]] = (),
        setup: Callable[[PlacedMqttClient], None] | None = None,
        start: bool = True,
    ) -> PlacedMqttClient:
        """A connected paho client (:class:`PlacedMqttClient`) on ``node`` (any node if None), that fails
        over to the next node when its connection drops.  See :meth:`mqtt_placer` and
        :meth:`MqttPlacer.connect`.

        :raises NoCandidateNode: no such node.  :raises NodeUnreachable: the LB never reached it.
        :raises AuthenticationFailed: refused credentials.  :raises ConnectionFailed: no node answered.
        """
        placer = self.mqtt_placer(via=via, entry_points=entry_points, options=options)
        return placer.connect(client_id, node, subscriptions=subscriptions, setup=setup, start=start)

    def mqtt_fleet(self, size: int, *, via: str | Address | None = None, entry_points: Any = None,
                   options: MqttOptions | None = None, **fleet: Any) -> MqttFleet:
        """An unstarted :class:`MqttFleet` of ``size`` connections (``with env.mqtt_fleet(1000) as fleet:``)."""
        from smartclient.mqtt.fleet import MqttFleet

        return MqttFleet(self.mqtt_placer(via=via, entry_points=entry_points, options=options), size, **fleet)

    # -- stream management (basic; arguments are validated by the caller) --------------------------
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
        from rstream.exceptions import PreconditionFailed, StreamAlreadyExists

        validate_stream_name(stream)
        args = StreamArguments.coerce(arguments)
        locator = await self._locator_client()
        with map_stream_errors(f"creating stream {stream!r}"):
            try:
                await locator.create_stream(stream, args.to_stream_protocol())
            except StreamAlreadyExists:
                if not exists_ok:
                    raise TopologyError(f"stream {stream!r} already exists") from None
            except PreconditionFailed:
                raise TopologyError(await self._arguments_differ(stream, args)) from None

    async def _arguments_differ(self, stream: str, asked: StreamArguments) -> str:
        """Why creating ``stream`` with ``asked`` met PreconditionFailed: it exists with other arguments."""
        from urllib.parse import quote

        base = f"stream {stream!r} already exists with other arguments than {asked.to_amqp()}"
        if self.management is None:
            return base + " (give the Environment a ManagementClient to see which differ)"
        path = f"/api/queues/{quote(self.settings.vhost, safe='')}/{quote(stream, safe='')}"
        try:
            found: dict[str, Any] = (await asyncio.to_thread(self.management.get, path)).get("arguments", {})
        except ManagementError as exc:
            return base + f" (reading them through the management API failed: {exc})"
        wanted = asked.to_amqp()
        differ = [f"{key}: asked {wanted.get(key)!r}, it has {found.get(key)!r}"
                  for key in sorted(set(wanted) | set(found))
                  if str(wanted.get(key)) != str(found.get(key))]
        return f"stream {stream!r} already exists with other arguments: " + ("; ".join(differ) or "none differ")

    async def stored_offset(self, stream: str, name: str) -> int | None:
        """The offset stored on the server for consumer ``name`` on ``stream``, or None if there is none.

        :raises StreamNotFound: the stream does not exist.
        """
        from rstream.exceptions import OffsetNotFound

        self._check_open()
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a consumer name must be a non-empty str, not {name!r}")
        locator = await self._locator_client()
        with map_stream_errors(f"querying the offset of {name!r} on {stream!r}"):
            try:
                return int(await step("offset query", locator.query_offset(stream, name)))
            except OffsetNotFound:  # nothing stored yet: an answer, not an error
                return None

    async def stream_stats(self, stream: str) -> dict[str, int]:
        """The broker's statistics of ``stream`` (StreamStats): ``first_chunk_id``, ``committed_chunk_id``
        and, on newer brokers, more.  Uses a short connection of its own, placed on a stream member.

        :raises StreamNotFound: the stream does not exist.
        :raises FeatureNotSupported: the broker has no StreamStats command (before 3.11).
        """
        self._check_open()
        from smartclient.stream.stats import query_stream_stats

        topo = await self.topology(stream)
        candidates = topo.candidates(Role.LOCATOR)
        conn = await self.connector.acquire(candidates, f"{self.connection_name}-stats")
        try:
            with map_stream_errors(f"reading the statistics of {stream!r}"):
                return await query_stream_stats(conn.client, stream)
        finally:
            await self.connector.close_connection(conn)

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
        from rstream.exceptions import StreamAlreadyExists

        from smartclient.stream.super_stream import partition_names

        validate_stream_name(super_stream)
        names, keys = partition_names(super_stream, partitions, binding_keys)
        for name in names:
            validate_stream_name(name)
        args = StreamArguments.coerce(arguments)
        if management is None and 29 not in await self.command_versions():  # CreateSuperStream
            management = self.management
            if management is None:
                raise FeatureNotSupported(
                    "the broker has no CreateSuperStream command (RabbitMQ < 3.13): give the Environment a "
                    "ManagementClient (management=...) to build the super stream's AMQP topology instead"
                )
        if management is not None:
            self._create_super_stream_over_http(management, super_stream, names, keys, args, exists_ok)
            return names
        locator = await self._locator_client()
        with map_stream_errors(f"creating super stream {super_stream!r}"):
            try:
                await locator.create_super_stream(super_stream, names, keys, args.to_stream_protocol())
            except StreamAlreadyExists:
                if not exists_ok:
                    raise TopologyError(f"super stream {super_stream!r} already exists") from None
        return names

    def _create_super_stream_over_http(self, api: ManagementClient, super_stream: str, names: list[str],
                                       keys: list[str], args: StreamArguments, exists_ok: bool) -> None:
        from urllib.parse import quote

        vhost = quote(self.settings.vhost, safe="")
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

    async def delete_super_stream(self, super_stream: str, missing_ok: bool = False) -> None:
        """Delete ``super_stream`` and its partitions; this Environment's producers and consumers of them
        close quietly first (their pending messages fail with the reason).

        :raises StreamNotFound: there is no such super stream and ``missing_ok`` is False.
        """
        self._check_open()
        from smartclient._errors import StreamNotFound

        locator = await self._locator_client()
        try:
            with map_stream_errors(f"listing the partitions of {super_stream!r}"):
                partitions = set(await locator.partitions(super_stream))
        except SmartClientError:
            partitions = set()
        await self._end_handles_of(partitions, f"super stream {super_stream!r} was deleted by this Environment")
        try:
            with map_stream_errors(f"deleting super stream {super_stream!r}"):
                await locator.delete_super_stream(super_stream)
        except StreamNotFound:
            if not missing_ok:
                raise
        for partition in partitions:
            self._drop_topologies(stream=partition)

    async def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of ``super_stream``, in routing order.

        :raises StreamNotFound: there is no such super stream.
        """
        self._check_open()
        from smartclient._errors import StreamNotFound

        locator = await self._locator_client()
        with map_stream_errors(f"listing the partitions of {super_stream!r}"):
            names = list(await locator.partitions(super_stream))
        if not names:
            raise StreamNotFound(f"super stream {super_stream!r} does not exist or has no partitions")
        return names

    async def route(self, super_stream: str, routing_key: str) -> list[str]:
        """The partitions the broker's bindings give for ``routing_key`` (the Route command)."""
        self._check_open()
        locator = await self._locator_client()
        with map_stream_errors(f"routing {routing_key!r} in {super_stream!r}"):
            return list(await locator.route(routing_key, super_stream))

    async def super_stream_producer(
        self, super_stream: str, *, routing: str = "hash", key: Callable[[Any], str] | None = None,
        name: str | None = None,
    ) -> SuperStreamProducer:
        """A producer on every partition of ``super_stream``, each on its partition's leader.

        :param routing: ``"hash"`` (murmur3, compatible with the Java/Go/JS clients) or ``"key"`` (the
            broker's bindings, through the Route command).
        :param key: extracts the routing key from a message (or pass ``key=`` to ``send``).
        :param name: producer name for deduplication (the same name on every partition).
        """
        self._check_open()
        from smartclient.stream.super_stream import SuperStreamProducer

        handle = SuperStreamProducer(self, super_stream, await self.partitions(super_stream), routing, key, name)
        try:
            await handle._open()
        except BaseException:
            await handle.close()
            raise
        return handle

    async def super_stream_consumer(
        self,
        super_stream: str,
        callback: Callable[[Any, Any], Awaitable[None] | None],
        *,
        offset: OffsetSpec | str | int | datetime.datetime = "next",
        name: str | None = None,
        single_active: bool = False,
        tracking: OffsetTracking | None = None,
    ) -> SuperStreamConsumer:
        """A consumer on every partition.  With ``name`` and ``single_active``, the broker keeps one
        active consumer per partition across every instance of the name (and fails over between them)."""
        self._check_open()
        from smartclient.stream.super_stream import SuperStreamConsumer

        spec = OffsetSpec.parse(offset)
        handle = SuperStreamConsumer(self, super_stream, await self.partitions(super_stream))
        try:
            await handle._open(callback, spec, name, single_active, tracking)
        except BaseException:
            await handle.close()
            raise
        return handle

    async def delete_stream(self, stream: str, missing_ok: bool = False) -> None:
        """Delete ``stream``.  This Environment's producers and consumers of it close quietly first: no
        recovery, no warning; their ``failure`` says why and their pending messages fail with that reason.

        :raises StreamNotFound: the stream does not exist and ``missing_ok`` is False.
        """
        self._check_open()
        from smartclient._errors import StreamNotFound

        await self._end_handles_of({stream}, f"stream {stream!r} was deleted by this Environment")
        locator = await self._locator_client()
        try:
            with map_stream_errors(f"deleting stream {stream!r}"):
                await locator.delete_stream(stream)
        except StreamNotFound:
            if not missing_ok:
                raise
        self._drop_topologies(stream=stream)

    async def _end_handles_of(self, streams: set[str], reason: str) -> None:
        """Close this Environment's producers and consumers of ``streams`` quietly, before it deletes them:
        no recovery, and every message still pending fails with ``reason``."""
        for handle in [h for h in self._handles if h.stream in streams]:
            await handle._end(reason)

