"""The seam between rstream and smartclient: rstream's ``ClientPool``, placed by the Environment.

rstream's ``Producer`` and ``Consumer`` get every connection from
``self._pool.get(...)``: without an address for the locator (metadata)
connection, and with the advertised address of the node rstream chose for a
stream.  :class:`PlacedClientPool` replaces that pool: the locator request
gets the Environment's one shared locator connection, and a stream request
gets a connection placed by smartclient's candidates and node check, whatever
address rstream chose.  ``tests/unit/test_rstream_seam.py`` fails loudly if
rstream moves this seam; the version range is pinned in ``pyproject.toml``.

Recovery is taken over too.  rstream reacts to a lost connection or a MetadataUpdate with
``maybe_restart_producer`` / ``maybe_restart_subscriber``: it drops its bookkeeping, then waits 2-9 s
(producers) or does nothing (consumers, whose recovery is off by default), and never resends
unconfirmed messages.  :class:`PlacedProducer` and :class:`PlacedConsumer` replace those two methods
with a hand-over to the smartclient handle, which recovers under its :class:`RecoveryPolicy`, with
:func:`forget_publisher` / :func:`forget_subscriber` clearing rstream's state first.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from rstream import AMQPMessage, ConsumerOffsetSpecification, FilterConfiguration, OffsetType, amqp_decoder, schema
from rstream import Consumer as RConsumer
from rstream import Producer as RProducer
from rstream import exceptions as rx
from rstream.client import Addr, Client, ClientPool
from rstream.connection import Connection as RConnection
from rstream.constants import SlasMechanism
from rstream.producer import _Publisher
from rstream.utils import MonotonicSeq, OnClosedErrorInfo

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    ResolutionError,
    SmartClientError,
    StreamNotFound,
    TopologyError,
)
from smartclient.core.address import Address
from smartclient.core.deadline import remaining, step
from smartclient.core.topology import Role

if TYPE_CHECKING:
    from smartclient.core.settings import ConnectSettings
    from smartclient.stream.host import Connection, StreamHost

__all__ = ["LocatorClient", "NamedClient", "PlacedClientPool", "PlacedConsumer", "PlacedProducer", "close_publisher",
           "close_subscriber", "closed_forwarder", "forget_publisher", "forget_subscriber", "map_stream_errors"]

log = logging.getLogger(__name__)

MAX_ITEM_ALLOWED = 200  # rstream.constants.MAX_ITEM_ALLOWED; the seam test checks it


class _NamedConnection(RConnection):
    def __init__(self, host: str, port: int, ssl_context: Any, server_hostname: str | None) -> None:
        super().__init__(host, port, ssl_context)
        self.server_hostname = server_hostname

    async def open(self) -> None:
        kwargs: dict[str, Any] = {}
        if self._ssl_context is not None and self.server_hostname:
            kwargs["server_hostname"] = self.server_hostname
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(host=self.host, port=self.port, ssl=self._ssl_context, **kwargs),
                timeout=remaining(),  # the attempt's time left, not a fixed timeout of its own
            )
        except asyncio.TimeoutError:
            raise ConnectionError(f"Could not connect to {self.host}:{self.port}") from None


class NamedClient(Client):
    """rstream's Client, opening its socket with ``server_hostname`` (set before :meth:`start`)."""

    server_hostname: str | None = None

    async def start(self) -> None:
        # rstream's Client.start, with our connection class (tests/unit/test_rstream_seam.py pins it)
        assert self._conn is None
        self._conn = _NamedConnection(self.host, self.port, self._ssl_context, self.server_hostname)
        await self._conn.open()
        self.start_task("listener", self._listener())
        self.add_handler(schema.Heartbeat, self._on_heartbeat)
        self.add_handler(schema.Close, self._on_close)


class LocatorClient(NamedClient):
    """The Environment's shared metadata connection.  rstream closes its locator after each lookup;
    this one stays open until the Environment closes it with :meth:`shutdown`."""

    async def close(self) -> None:
        return None

    async def shutdown(self) -> None:
        await super().close()


class PlacedClientPool(ClientPool):
    """A ``ClientPool`` whose connections the Environment places.

    Every rstream Producer/Consumer (a *carrier*) of one Environment and role gets its connections from
    the Environment's one list of shared connections for that role (see ``Environment._place``): many
    carriers share one connection per node, up to ``PoolLimits.max_streams_per_connection``.
    Publisher and subscriber ids are therefore taken per *connection* (:meth:`Connection.take_id`), where
    rstream would number them per carrier.
    """

    def __init__(self, host: StreamHost, role: Role, carrier: Any, settings: ConnectSettings) -> None:
        super().__init__(
            "placed-by-smartclient", 1, vhost="/", username="-", password="-",
            frame_max=settings.frame_max, heartbeat=settings.heartbeat,
            load_balancer_mode=False, max_retries=1,
        )
        self.host = host
        self.role = role
        self.carrier = carrier
        self.names: dict[str, str | None] = {}  # stream -> producer/consumer name, for the placement table
        self.last: Connection | None = None  # the connection the last placement returned (for its id)

    async def get(
        self,
        connection_name: str | None,
        addr: Addr | None = None,
        connection_closed_handler: Any = None,
        stream: str | None = None,
        sasl_configuration_mechanism: SlasMechanism | None = None,
        max_clients_by_connections: int = MAX_ITEM_ALLOWED,
        locator_request: bool = False,
    ) -> Client:
        if addr is None or locator_request or stream is None:
            locator: Client = await self.host.locator()
            return locator
        conn = await self.host.place(self, stream, connection_closed_handler)
        self.last = conn
        client: Client = conn.client
        return client

    async def close(self) -> None:
        self._clients.clear()  # the connections are the Environment's: it closes them


_PLACED = Addr("placed-by-smartclient", 0)  # rstream wants an address; the Environment chooses the node


def _conn_of(client: Any) -> Connection | None:
    conn: Connection | None = getattr(client, "smartclient_conn", None)
    return conn


class _Placed:
    """What both placed carriers share: their connections come from the Environment's placement."""

    smartclient_host: StreamHost
    _pool: ClientPool  # a PlacedClientPool, set by new_carrier
    _clients: dict[str, Client]
    _connection_name: str
    _on_connection_closed: Any

    async def _get_or_create_client(self, stream: str) -> Client:
        # rstream would first ask its locator where to go: the Environment's placement decides that
        if stream not in self._clients:
            self._clients[stream] = await self._pool.get(
                self._connection_name, addr=_PLACED, connection_closed_handler=self._on_connection_closed,
                stream=stream)
        return self._clients[stream]


class PlacedProducer(_Placed, RProducer):
    """rstream's Producer, placed by smartclient, with publisher ids per connection and its recovery
    handed to the smartclient Producer of the stream."""

    async def _get_or_create_publisher(self, stream: str, publisher_name: str | None = None) -> _Publisher:
        # rstream's, with the id taken on the connection (rstream takes it per Producer, before it knows the
        # connection), the declaration bounded by the attempt's deadline, and a clean slate on any failure
        publisher = self._find_producer_by_stream(stream)
        if publisher is not None:
            return publisher
        client = await self._get_or_create_client(stream)
        conn = _conn_of(client)
        publisher_id = conn.take_id(self._publishers) if conn is not None else self._get_next_available_id()
        await client.inc_available_id()
        publisher = self._publishers[publisher_id] = _Publisher(
            id=publisher_id, stream=stream, reference=publisher_name, sequence=MonotonicSeq(), client=client)
        try:
            await step("declaring the publisher", client.declare_publisher(
                stream=stream, reference=publisher_name, publisher_id=publisher_id))
        except BaseException:
            await asyncio.shield(forget_publisher(self, stream, keep={publisher_id}))  # declared or not?
            raise
        client.add_handler(schema.MetadataUpdate, partial(_on_metadata, self, client, Role.PRODUCER),
                           name=str(publisher_id))
        return publisher

    async def maybe_restart_producer(self, reason: str, stream: str) -> None:
        self.smartclient_host.lost(Role.PRODUCER, self, stream, reason)


class PlacedConsumer(_Placed, RConsumer):
    """rstream's Consumer, placed by smartclient, with subscription ids per connection and its recovery
    handed to the smartclient Consumer of the stream."""

    async def get_available_id(self) -> int:
        # called by rstream's _create_subscriber right after _get_or_create_client, under the carrier's lock
        pool = self._pool
        conn = pool.last if isinstance(pool, PlacedClientPool) else None
        if conn is None:
            return await super().get_available_id()
        return conn.take_id(self._subscribers)

    async def maybe_restart_subscriber(self, reason: str, stream: str) -> None:
        self.smartclient_host.lost(Role.CONSUMER, self, stream, reason)


def new_carrier(role: Role, host: StreamHost, settings: ConnectSettings, entry: Address, name: str,
                limit: int) -> Any:
    """An rstream Producer (or Consumer) whose connections ``host`` places and whose losses it is told of."""
    creds = settings.credentials
    kwargs: dict[str, Any] = dict(
        host=entry.host, port=entry.port, username=creds.username, password=creds.password, vhost=settings.vhost,
        ssl_context=settings.tls, frame_max=settings.frame_max, heartbeat=settings.heartbeat, connection_name=name)
    carrier: PlacedProducer | PlacedConsumer
    if role is Role.PRODUCER:
        carrier = PlacedProducer(**kwargs, max_publishers_by_connection=limit)
    else:
        carrier = PlacedConsumer(**kwargs, max_subscribers_by_connection=limit)
    carrier._pool = PlacedClientPool(host, role, carrier, settings)
    carrier.smartclient_host = host
    return carrier


async def _on_metadata(carrier: Any, client: Any, role: Role, frame: schema.MetadataUpdate) -> None:
    """A MetadataUpdate that reached ``client``: only the carrier's stream on that very connection is lost (a
    shared connection carries other carriers' streams, and this carrier may have the stream elsewhere)."""
    stream = frame.metadata_info.stream
    if carrier._clients.get(stream) is client:
        carrier.smartclient_host.lost(role, carrier, stream, "Metadata Update")


def closed_forwarder(carrier: Any, client: Any, handler: Any) -> Any:
    """rstream's connection-closed handler of ``carrier``, told only of its own streams on ``client``
    (a shared connection also carries other carriers' streams)."""

    def forward(info: OnClosedErrorInfo) -> Any:
        streams = [s for s in dict.fromkeys(info.streams) if carrier._clients.get(s) is client]
        return handler(OnClosedErrorInfo(info.reason, streams)) if streams else None

    return forward


async def _delete_on_broker(client: Any, kind: str, ident: int, default: float) -> bool:
    """DeletePublisher / Unsubscribe ``ident``; True once the broker no longer has it (or the connection is
    gone), False if the outcome is unknown (a timeout, a cancellation, another error)."""
    if not client.is_connection_alive():
        return True
    request = client.delete_publisher(ident) if kind == "publisher" else client.unsubscribe(ident)
    try:
        await step(f"deleting the {kind} {ident}", request, default=default)
    except (rx.PublisherDoesNotExist, rx.SubscriptionIDDoesNotExist):
        return True
    except Exception as exc:
        log.debug("deleting %s %s: %s", kind, ident, exc)
        return not client.is_connection_alive()
    return True


def _retire(client: Any, kind: str, ident: int) -> None:
    """Keep ``ident`` taken on its connection until the broker confirms it dropped it, in the background:
    an id whose fate is unknown must not be handed to the next publisher or subscription there."""

    async def retire() -> None:
        for _ in range(3):
            if await _delete_on_broker(client, kind, ident, default=5.0):
                _free_id(client, ident)
                return
        log.warning("the broker never confirmed dropping %s %s: its id stays out of use on that connection",
                    kind, ident)

    task = asyncio.ensure_future(retire())
    _retiring.add(task)
    task.add_done_callback(_retiring.discard)


_retiring: set[asyncio.Future[None]] = set()


async def close_publisher(carrier: RProducer, stream: str) -> None:
    """Delete the publisher of ``stream`` on the broker (within the current deadline), then forget it; an id
    whose deletion is not confirmed stays out of use until it is."""
    unknown = set()
    for pid, publisher in [(i, p) for i, p in carrier._publishers.items() if p.stream == stream]:
        if not await _delete_on_broker(publisher.client, "publisher", pid, default=5.0):
            unknown.add(pid)
    await forget_publisher(carrier, stream, keep=unknown)


async def close_subscriber(carrier: RConsumer, stream: str) -> None:
    """Unsubscribe the subscription of ``stream`` on the broker (within the current deadline), then forget
    it; an id whose unsubscription is not confirmed stays out of use until it is."""
    unknown = set()
    for sid, subscriber in [(i, s) for i, s in carrier._subscribers.items() if s.stream == stream]:
        await subscriber.client.stop_queue_listener_task(subscriber_id=sid)
        if not await _delete_on_broker(subscriber.client, "subscription", sid, default=5.0):
            unknown.add(sid)
    await forget_subscriber(carrier, stream, keep=unknown)


async def forget_publisher(carrier: RProducer, stream: str, dead_only: bool = False,
                           keep: set[int] | frozenset[int] = frozenset()) -> None:
    """Drop rstream's (lost) publisher on ``stream`` and its client entry, without talking to the broker
    (which has already dropped it, or is gone).  ``dead_only``: only if its connection is closed (a loss
    reported after its producer closed must not touch a newer producer of the same stream)."""
    async with carrier._lock:
        for pid, publisher in list(carrier._publishers.items()):
            if publisher.stream == stream and not (dead_only and publisher.client.is_connection_alive()):
                for frame in (schema.PublishConfirm, schema.PublishError, schema.MetadataUpdate):
                    publisher.client._handlers.get(frame, {}).pop(str(pid), None)
                del carrier._publishers[pid]
                if pid in keep:
                    _retire(publisher.client, "publisher", pid)
                else:
                    _free_id(publisher.client, pid)
        await _drop_client(carrier, stream, dead_only)


async def forget_subscriber(carrier: RConsumer, stream: str, dead_only: bool = False,
                            keep: set[int] | frozenset[int] = frozenset()) -> Any:
    """Drop rstream's (lost) subscriber on ``stream``: stop its delivery task (frames still queued are
    discarded: the consumer resumes after the last message it handed over), its handlers and its client
    entry.  Returns the rstream subscriber, or None."""
    found = None
    async with carrier._lock:
        for sid, subscriber in list(carrier._subscribers.items()):
            if subscriber.stream == stream and not (dead_only and subscriber.client.is_connection_alive()):
                found = subscriber
                client = subscriber.client
                await client.stop_queue_listener_task(subscriber_id=sid)
                for frame in (schema.Deliver, schema.MetadataUpdate, schema.ConsumerUpdateResponse):
                    client._handlers.get(frame, {}).pop(str(sid), None)
                client._frames.pop(sid, None)
                del carrier._subscribers[sid]
                if sid in keep:
                    _retire(client, "subscription", sid)
                else:
                    _free_id(client, sid)
        await _drop_client(carrier, stream, dead_only)
    return found


def _free_id(client: Any, ident: int) -> None:
    conn = _conn_of(client)
    if conn is not None:
        conn.ids.discard(ident)


async def _drop_client(carrier: RProducer | RConsumer, stream: str, dead_only: bool = False) -> None:
    client: Any = carrier._clients.get(stream)
    if client is None or (dead_only and client.is_connection_alive()):
        return
    del carrier._clients[stream]
    await client.remove_stream(stream)
    await client.free_available_id()
    conn = _conn_of(client)
    if conn is None:
        return
    if all(other is not client for other in carrier._clients.values()):
        conn.forwards.pop(id(carrier), None)  # this carrier has nothing left on it
    if conn.alive() and await client.get_stream_count() == 0:
        host: StreamHost = carrier.smartclient_host  # type: ignore[union-attr]
        await host.unused(conn)


# -- rstream's errors, mapped in one place -----------------------------------------------------------
@contextmanager
def map_stream_errors(context: str) -> Iterator[None]:
    """Re-raise errors from rstream and sockets as :class:`SmartClientError` subclasses, naming ``context``."""
    try:
        yield
    except SmartClientError:
        raise
    except (rx.AuthenticationFailure, rx.SASLError, rx.SASLAuthenticationFailureLoopback,
            rx.SASLMechanismNotSupported) as exc:
        raise AuthenticationFailed(f"{context}: the broker refused the credentials ({type(exc).__name__})") from exc
    except rx.VirtualHostAccessFailure as exc:
        raise AuthenticationFailed(f"{context}: no access to the vhost, or it does not exist") from exc
    except rx.StreamDoesNotExist as exc:
        raise StreamNotFound(f"{context}: the stream does not exist") from exc
    except rx.PreconditionFailed as exc:
        raise TopologyError(f"{context}: the broker refused it (precondition failed: a name already in use, or "
                            f"arguments other than those the stream has)") from exc
    except (rx.LeaderNotAvailable, rx.StreamNotAvailable) as exc:
        raise TopologyError(f"{context}: the stream has no leader available yet") from exc
    except socket.gaierror as exc:
        raise ResolutionError(f"{context}: the host name could not be resolved ({exc}); "
                              f"a resolver (StaticMap, DnsResolver) can map it") from exc
    except ssl.SSLCertVerificationError as exc:
        raise CertificateRejected(f"{context}: TLS certificate verify failed: {exc.verify_message or exc}") from exc
    except ssl.SSLError as exc:
        raise ConnectionFailed(f"{context}: TLS failed: {exc}") from exc
    except asyncio.TimeoutError as exc:  # rstream's own request timeout; its message is empty
        raise ConnectionFailed(f"{context}: the broker did not answer in time") from exc
    except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
        raise ConnectionFailed(f"{context}: {type(exc).__name__}: {exc or 'connection closed'}") from exc
    except rx.ServerError as exc:
        raise ConnectionFailed(f"{context}: the broker answered {type(exc).__name__}: {exc}") from exc


# -- connections -------------------------------------------------------------------------------------
def new_client(cls: type[Client] | None, *, host: str, port: int, tls: ssl.SSLContext | None, frame_max: int,
               heartbeat: int, name: str, on_closed: Any, max_ids: int, server_hostname: str | None) -> Client:
    """An unstarted rstream client (a :class:`NamedClient` unless ``cls`` says otherwise)."""
    client = (cls or NamedClient)(host=host, port=port, ssl_context=tls, frame_max=frame_max, heartbeat=heartbeat,
                                  connection_name=name, connection_closed_handler=on_closed,
                                  max_clients_by_connections=max_ids)
    if isinstance(client, NamedClient):
        client.server_hostname = server_hostname
    return client


def identity(client: Any) -> tuple[Address | None, str]:
    """The node an opened connection reports (``advertised_host``/``advertised_port``), and its name."""
    props = client.server_properties or {}
    try:
        node: Address | None = Address(props["advertised_host"], int(props["advertised_port"]))
    except (KeyError, ValueError):
        node = None
    return node, str(client._client_properties["connection_name"])


def attach(client: Any, conn: Connection) -> None:
    client.smartclient_conn = conn


async def abort(client: Any) -> None:
    """Drop a connection that failed while it was being opened, without a Close handshake (the broker may
    be the reason it failed, and the attempt's time is spent)."""
    for name in list(client._tasks):
        await client.stop_task(name)
    conn = client._conn
    writer = getattr(conn, "_writer", None) if conn is not None else None
    if writer is not None:
        writer.transport.abort()
    client._is_not_closed = False


def on_metadata_update(client: Any, handler: Callable[[Any], Any], name: str) -> None:
    client.add_handler(schema.MetadataUpdate, handler, name=name)


def metadata_stream(frame: Any) -> str:
    return str(frame.metadata_info.stream)


# -- the publish path ------------------------------------------------------------------------------------
def writer_of(client: Any) -> asyncio.StreamWriter:
    """The socket writer of ``client``: the publish path writes its own Publish frames on it."""
    writer: asyncio.StreamWriter = client._conn._writer
    return writer


def frame_max_of(client: Any) -> int:
    return int(client._frame_max)


def on_publish_frames(client: Any, name: str, on_confirm: Callable[[Any], None], on_error: Callable[[Any], None]
                      ) -> None:
    client.add_handler(schema.PublishConfirm, on_confirm, name=name)
    client.add_handler(schema.PublishError, on_error, name=name)


def off_publish_frames(client: Any, name: str) -> None:
    for frame in (schema.PublishConfirm, schema.PublishError):
        client._handlers.get(frame, {}).pop(name, None)


# -- the locator's requests ----------------------------------------------------------------------------
async def leader_and_replicas(locator: Any, stream: str) -> tuple[Address, list[Address]] | None:
    """The stream's leader and replicas, or None while it has no leader (an election)."""
    try:
        leader, replicas = await locator.query_leader_and_replicas(stream)
    except rx.LeaderNotAvailable:
        return None
    return Address(leader.host, leader.port), [Address(r.host, r.port) for r in replicas]


async def create_stream(locator: Any, stream: str, arguments: dict[str, str]) -> str:
    """``"created"``, ``"exists"`` (with these arguments) or ``"differs"`` (exists with others)."""
    try:
        await locator.create_stream(stream, arguments)
    except rx.StreamAlreadyExists:
        return "exists"
    except rx.PreconditionFailed:
        return "differs"
    return "created"


async def create_super_stream(locator: Any, super_stream: str, names: list[str], keys: list[str],
                              arguments: dict[str, str]) -> bool:
    """Create it; False if it exists already."""
    try:
        await locator.create_super_stream(super_stream, names, keys, arguments)
    except rx.StreamAlreadyExists:
        return False
    return True


async def query_offset(client: Any, stream: str, name: str) -> int | None:
    """The offset stored for ``name`` on ``stream``, or None if none is."""
    try:
        return int(await client.query_offset(stream, name))
    except rx.OffsetNotFound:
        return None


async def command_versions(locator: Any) -> dict[int, tuple[int, int]]:
    """The broker's stream commands, ``{key: (min_version, max_version)}`` (ExchangeCommandVersions)."""
    ours = [schema.FrameHandlerInfo(2, 1, 2)]  # what we speak is not what matters here
    response = await locator.sync_request(
        schema.ExchangeCommandVersionRequest(locator._corr_id_seq.next(), command_versions=ours),
        resp_schema=schema.ExchangeCommandVersionResponse, raise_exception=False,
    )
    return {c.key_command: (c.min_version, c.max_version) for c in response.command_versions}


async def raw_request(client: Any, frame: bytes, response_key: int, refused: Callable[[], BaseException]) -> bytes:
    """Send ``frame`` on ``client`` and return the frame answering it (size prefix stripped), for a command
    rstream does not know (its reader would stop on the answer).  The client's reader and heartbeat stop:
    close it afterwards.  ``refused()`` is raised if the broker closes instead of answering."""
    await client.stop_task("listener")
    await client.stop_task("heartbeat_sender")
    conn = client._conn
    conn._writer.write(frame)
    await conn._writer.drain()
    for _ in range(16):  # skip heartbeats or other frames that were already on their way
        raw = bytes(await conn._read_frame_raw())
        (key,) = struct.unpack_from(">H", raw, 0)
        if key == response_key:
            return raw
        if key in (0x0016, 0x0016 | 0x8000):  # Close: the broker does not know the command
            break
    raise refused()


# -- producers and consumers -------------------------------------------------------------------------
async def declare_publisher(carrier: Any, stream: str, name: str | None) -> tuple[Any, int]:
    """Place and declare the publisher of ``stream`` on ``carrier``; its client and publisher id."""
    publisher = await carrier._get_or_create_publisher(stream, publisher_name=name)
    return publisher.client, publisher.id


async def stored_sequence(client: Any, stream: str, name: str) -> int:
    return int(await step("reading the stored publishing id", client.query_publisher_sequence(stream, name)))


def offset_spec(spec: Any) -> ConsumerOffsetSpecification:
    """rstream's offset specification for an :class:`~smartclient.core.offsets.OffsetSpec`."""
    simple = {"first": OffsetType.FIRST, "last": OffsetType.LAST, "next": OffsetType.NEXT}
    if spec.kind in simple:
        return ConsumerOffsetSpecification(simple[spec.kind], None)
    if spec.kind == "offset":
        return ConsumerOffsetSpecification(OffsetType.OFFSET, int(spec.value))
    return ConsumerOffsetSpecification(OffsetType.TIMESTAMP, spec.timestamp_ms())


def consumer_update_answer(spec: Any) -> schema.OffsetSpecification:
    """What a single active consumer answers the broker's ConsumerUpdate with."""
    ours = offset_spec(spec)
    value = ours.offset if ours.offset is not None else 0
    return schema.OffsetSpecification(offset_type=int(OffsetType(ours.offset_type)), offset=value)


def filter_config(stream_filter: Any) -> FilterConfiguration:
    return FilterConfiguration(list(stream_filter.values), stream_filter.post_filter, stream_filter.match_unfiltered)


async def subscribe(carrier: Any, stream: str, deliver: Any, offset: Any, **how: Any) -> tuple[int, Any]:
    """Subscribe, within the attempt's time (placement included); the subscription id and rstream's
    subscriber (whose position is the offset after the last chunk).  On any failure, nothing is left."""
    try:
        sid = await step("subscribing", carrier.subscribe(stream, deliver, offset_specification=offset_spec(offset),
                                                          **how))
    except BaseException:
        await asyncio.shield(_abandon_subscription(carrier, stream))
        raise
    subscriber = carrier._subscribers[sid]
    client = subscriber.client  # rstream's handler reacts to its streams on any connection: bind this one
    client._handlers[schema.MetadataUpdate][str(sid)] = partial(_on_metadata, carrier, client, Role.CONSUMER)
    return sid, subscriber


async def _abandon_subscription(carrier: Any, stream: str) -> None:
    sids = {i for i, s in carrier._subscribers.items() if s.stream == stream}
    await forget_subscriber(carrier, stream, keep=sids)


def position(subscriber: Any) -> int:
    return int(subscriber.offset)


async def store_offset(carrier: Any, stream: str, name: str, value: int) -> None:
    await carrier.store_offset(stream, name, value)


def amqp_message(body: bytes, application_properties: dict[str, Any] | None) -> Any:
    """An AMQP 1.0 message rstream encodes (application properties carried)."""
    return AMQPMessage(body=body, application_properties=application_properties)


def is_amqp_message(value: Any) -> bool:
    return isinstance(value, AMQPMessage)


def decode_amqp_message(raw: bytes) -> Any:
    return amqp_decoder(raw)
