"""The seam to rstream, wire side: its client with the TLS name smartclient chooses, its errors mapped
in one place, and the frames and values smartclient reads or writes on rstream's connections itself
(Publish frames and confirms, metadata, StreamStats, offset specifications; AMQP 1.0 messages in
:mod:`.messages`)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import ssl
import struct
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from rstream import ConsumerOffsetSpecification, FilterConfiguration, OffsetType, schema
from rstream import exceptions as rx
from rstream.client import Client
from rstream.connection import Connection as RConnection
from rstream.constants import SlasMechanism
from rstream.encoding import decode_frame
from rstream.utils import OnClosedErrorInfo

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    ResolutionError,
    SmartClientError,
    StreamNotFound,
    StreamNotReady,
    TokenRefused,
    TopologyError,
)
from smartclient.core.address import Address
from smartclient.core.deadline import remaining, within
from smartclient.core.relogin import certificate_alert
from smartclient.stream._rstream.deliveries import LeanDeliveries
from smartclient.stream._rstream.frames import decode_hot, read_frame_raw
from smartclient.stream._rstream.messages import amqp_message, body_of, decode_amqp_message, is_amqp_message
from smartclient.stream._rstream.silence import watch_silence
from smartclient.stream.socket_reader import FrameReader, open_frames

if TYPE_CHECKING:
    from smartclient.stream.host import Connection


T = TypeVar("T")
__all__ = [
    "HANDING",
    "LocatorClient",
    "NamedClient",
    "abort",
    "amqp_message",
    "attach",
    "body_of",
    "connection_of",
    "consumer_update_answer",
    "create_stream",
    "decode_amqp_message",
    "drop_socket",
    "few_at_a_time",
    "filter_config",
    "forget_handlers",
    "frame_max_of",
    "identity",
    "is_amqp_message",
    "leader_and_replicas",
    "map_stream_errors",
    "metadata_stream",
    "new_client",
    "off_publish_frames",
    "offset_spec",
    "on_metadata_update",
    "on_publish_frames",
    "query_offset",
    "socket_of",
    "update_secret",
    "writer_of",
]

log = logging.getLogger(__name__)


#: responses (key with the response bit) to the commands rstream does not know and smartclient sends on a
#: live connection itself; its reader would stop on them
RESOLVE_OFFSET_SPEC_KEY = 0x001F
STREAM_STATS_KEY = 0x001C  # (RabbitMQ 3.11+: smartclient.stream.stats, which imports no part of the seam at load)
EXTRA_RESPONSES = frozenset({RESOLVE_OFFSET_SPEC_KEY | 0x8000, STREAM_STATS_KEY | 0x8000})


class _NamedConnection(RConnection):
    def __init__(self, host: str, port: int, ssl_context: Any, server_hostname: str | None) -> None:
        super().__init__(host, port, ssl_context)
        self.server_hostname = server_hostname
        #: (response key, correlation id) -> the future of a request smartclient sent itself
        self.extra_waiters: dict[tuple[int, int], asyncio.Future[bytes]] = {}

    async def _read_frame_raw(self) -> bytes:  # type: ignore[override]  # bytes, where rstream's is a bytearray
        assert self._reader is not None
        return await read_frame_raw(self._reader)  # not 256 bytes at a time, as rstream reads

    async def read_frame(self) -> schema.Frame:
        """rstream's read_frame, except that the frames of the hot paths are decoded by :mod:`.frames`, and
        a response to a command rstream does not know answers the request smartclient sent
        (:func:`extra_request`) instead of stopping rstream's reader."""
        while True:
            raw = await self._read_frame_raw()
            frame = decode_hot(raw)
            if frame is not None:
                return frame  # type: ignore[no-any-return]
            key = (raw[0] << 8) | raw[1]
            if key not in EXTRA_RESPONSES:
                return decode_frame(raw)
            (corr,) = struct.unpack_from(">I", raw, 4)
            waiter = self.extra_waiters.pop((key, corr), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(bytes(raw))

    async def close(self) -> None:  # rstream's, and the read area handed back at once (FrameReader.release)
        try:
            await super().close()
        finally:
            if isinstance(self._reader, FrameReader):
                self._reader.release()

    async def open(self) -> None:
        kwargs: dict[str, Any] = {}
        if self._ssl_context is not None and self.server_hostname:
            kwargs["server_hostname"] = self.server_hostname
        try:
            self._reader, self._writer = await within(  # (a cancellation is never lost: see within)
                asyncio.ensure_future(open_frames(self.host, self.port, ssl=self._ssl_context, **kwargs)),
                remaining())  # the attempt's time left, not a fixed timeout of its own
        except asyncio.TimeoutError:
            raise ConnectionError(f"Could not connect to {self.host}:{self.port}") from None


class _Told:
    """A connection-closed handler that remembers it was called (it holds the handler, not the client: no cycle)."""

    __slots__ = ("handler", "told")

    def __init__(self, handler: Callable[[OnClosedErrorInfo], Any]) -> None:
        self.handler, self.told = handler, False

    def __call__(self, info: OnClosedErrorInfo) -> Any:
        self.told = True
        return self.handler(info)


class NamedClient(LeanDeliveries, Client):
    """rstream's Client, opening its socket with ``server_hostname``, whose delivery tasks (:mod:`.deliveries`)
    are never stopped in the middle of an application's handler (:meth:`stop_queue_listener_task`)."""

    server_hostname: str | None = None  # (set before start())
    #: called once the broker answered the connection's first request: it is alive, and judges the login next
    smartclient_on_answer: Callable[[], None] | None = None
    smartclient_reader_ended = False  #: its reader has stopped: no answer will ever come
    #: seconds of silence after which the connection is ended (ConnectionOptions.dead_after; 0: never)
    smartclient_dead_after = 0.0
    smartclient_silent_for: float | None = None  #: how long it had heard nothing when it was ended for that

    async def peer_properties(self) -> dict[str, str]:
        properties = await super().peer_properties()
        if self.smartclient_on_answer is not None:
            self.smartclient_on_answer()
        return properties

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: subscription id -> done when the chunk being handed to its callback has been (the delivery loop's)
        self.smartclient_handing: dict[int, asyncio.Future[None]] = {}
        #: subscriptions handed no further chunk (nor message): their delivery is being stopped, or their callback
        #: said stop
        self.smartclient_stopping: set[int] = set()
        #: subscription id -> the stop of its delivery task, put off until the chunk in the callback has been handed
        #: (asked from within that callback); its id is not free before it is done
        self.smartclient_deferred: dict[int, asyncio.Future[None]] = {}
        #: single active consumers' activations being answered, off the reader: subscription id -> its answers, in
        #: the order the broker asked (those of different subscriptions never wait for each other)
        self.smartclient_updates: dict[str, list[asyncio.Task[None]]] = {}
        if self._connection_closed_handler is not None:  # told of every end: see _listener
            self._connection_closed_handler = _Told(self._connection_closed_handler)

    def add_handler(self, frame_cls: Any, handler: Any, name: str | None = None) -> None:
        """rstream's, except that a single active consumer's activation (ConsumerUpdate) is answered from a task
        of its own instead of inside the connection's reader.  The answer needs the stored offset, read on
        another connection; awaited in the reader, it held every other frame of this connection (deliveries,
        Subscribe answers, heartbeats) for as long as that read took: a locator cut by a rolling restart kept all
        the consumers on one node silent for up to 10 s and timed their subscriptions out (the 2-hour soak,
        issue 32).  A subscription's answers still go out in the order the broker asked."""
        if frame_cls is schema.ConsumerUpdateResponse:
            name = name if name is not None else getattr(handler, "__name__", repr(handler))
            handler = self.smartclient_aside(handler, name)
        super().add_handler(frame_cls, handler, name)

    def smartclient_aside(self, handler: Callable[[Any], Any], name: str) -> Callable[[Any], None]:
        def answer_aside(frame: Any) -> None:
            if name.isdigit() and str(frame.subscription_id) != name:
                return  # another subscription's (rstream asks every handler)
            pending = self.smartclient_updates.setdefault(name, [])
            task = asyncio.ensure_future(self.smartclient_answer(handler, frame, pending[-1] if pending else None))
            pending.append(task)
            task.add_done_callback(partial(self.smartclient_answered, name))

        return answer_aside

    async def smartclient_answer(self, handler: Callable[[Any], Any], frame: Any,
                                 before: asyncio.Task[None] | None) -> None:
        if before is not None and not before.done():
            await asyncio.wait([before])
        try:
            if inspect.isawaitable(result := handler(frame)):
                await result
        except Exception as exc:  # the consumer said why (a raising on_update with its traceback) and recovers, or is
            # closed, or the connection is gone with the question
            log.info("%s:%s: subscription %s: its activation was not answered: %s: %s", self.host, self.port,
                     frame.subscription_id, type(exc).__name__, exc)

    def smartclient_answered(self, name: str, task: asyncio.Task[None]) -> None:
        pending = self.smartclient_updates.get(name)
        if pending is not None and task in pending:
            pending.remove(task)
            if not pending:
                del self.smartclient_updates[name]

    def smartclient_drop_updates(self, name: str | None = None) -> None:
        """Cancel the answers still being worked out: subscription ``name``'s (it is being removed: an answer
        for it would act on its consumer's next subscription), or all (the connection is gone)."""
        for key in [name] if name is not None else list(self.smartclient_updates):
            for task in list(self.smartclient_updates.get(key, ())):
                if task is not asyncio.current_task():
                    task.cancel()

    async def stop_queue_listener_task(self, subscriber_id: int) -> None:
        """rstream's, except that a chunk being handed to the application is never cut: no further chunk is
        handed over, the one in the callback is finished, and then the delivery task stops.  rstream cancelled
        the task, so an async handler got ``CancelledError`` in the middle of its chunk at every failover, and
        recovery, which resumes after the last chunk handed over, delivered that chunk again (issue 29)."""
        self.smartclient_stopping.add(subscriber_id)
        if subscriber_id in self.smartclient_deferred:
            return
        handing = self.smartclient_handing.get(subscriber_id)
        if handing is not None and HANDING.get() == (id(self), subscriber_id):
            # asked from within the callback (its consumer's close(), even through a task it started): it cannot
            # wait for itself; nothing more is handed over, and the task stops once the callback has returned
            self.smartclient_deferred[subscriber_id] = asyncio.ensure_future(
                self.smartclient_stop_when_handed(subscriber_id, handing))
            return
        if handing is not None:
            await _handler_done(handing, subscriber_id)
        await super().stop_queue_listener_task(subscriber_id)
        self.smartclient_stopping.discard(subscriber_id)  # (not on a cancellation: it stays handed nothing)

    async def smartclient_stop_when_handed(self, subscriber_id: int, handing: asyncio.Future[None]) -> None:
        await handing
        await super().stop_queue_listener_task(subscriber_id)
        self.smartclient_stopping.discard(subscriber_id)
        del self.smartclient_deferred[subscriber_id]

    async def start(self) -> None:
        # rstream's Client.start, with our connection class (tests/unit/test_rstream_seam.py pins it)
        assert self._conn is None
        self._conn = _NamedConnection(self.host, self.port, self._ssl_context, self.server_hostname)
        await self._conn.open()
        self.start_task("listener", self._listener())
        self.add_handler(schema.Heartbeat, self._on_heartbeat)
        self.add_handler(schema.Close, self._on_close)

    def _start_heartbeat(self) -> None:
        super()._start_heartbeat()
        if self.smartclient_dead_after and self._heartbeat:
            self.start_task("silence_watch", watch_silence(self, self.smartclient_dead_after, self._heartbeat))

    async def _listener(self) -> None:
        """rstream's reader, then: every request still waiting for an answer fails at once.  rstream leaves
        them to their timeouts, so a connection an LB closes during the handshake (its backend just died)
        hung an open for 10 s, and a metadata query on a dying connection for its whole bound.

        A reader that ended by itself (the peer closed the connection, or a write failed) closes the socket:
        rstream's ``close()`` leaves the socket of a broken connection open, half-closed (CLOSE_WAIT), until the
        garbage collector finds it; the soak counted one more descriptor per connection an LB or a node cut
        (issue 32).  (Cancelled by ``close()``, it leaves that to ``close()``.)  Its heartbeat stops with it:
        rstream's looks at the connection only every heartbeat interval (60 s), and held it till then, its read
        area (1 MiB) and TLS buffers too (5 closes on a TLS Environment: 7 held)."""
        try:
            await super()._listener()
        finally:
            self.smartclient_reader_ended = True
            self.fail_pending()
            self.smartclient_drop_updates()  # their answers have no connection to go out on
        # ended by itself (not stopped by close() or raw_request(), which see to the rest)
        self._is_not_closed = False  # (rstream's own reader sets it only on a closed socket)
        for name in ("heartbeat_sender", "silence_watch"):
            if (task := self._tasks.pop(name, None)) is not None and task is not asyncio.current_task():
                task.cancel()
        drop_socket(self)
        # nothing is read any more, so no frame is handed to a handler: its tables (rstream's own methods among
        # them) made the client a cycle, which kept the connection, its socket and TLS buffers until a full
        # collection; rstream's close() clears them too, but a lost connection's client may never be closed
        self._handlers.clear()
        # rstream tells its closed handler only of a connection with streams on it; one with none ended unseen,
        # and the connector kept it as open (the 2-hour soak: 5 became 18, their sockets closed)
        told = self._connection_closed_handler
        if isinstance(told, _Told) and not told.told:
            result = told(OnClosedErrorInfo("Connection Closed", []))
            if inspect.isawaitable(result):
                await result

    def wait_frame(self, frame_cls: Any, corr_id: int | None = None, timeout: int | None = None) -> Any:
        """rstream's; a request made once the reader has stopped fails at once: a TLS alert that ends the
        connection right after the handshake (a refused client certificate) can stop the reader before the
        login's first request is registered, which then waited for its whole bound."""
        waiter = super().wait_frame(frame_cls, corr_id, timeout)
        if self.smartclient_reader_ended:
            self.fail_pending()
        return waiter

    async def close(self) -> None:
        """rstream's, and the socket closed even when the connection was already broken (see :meth:`_listener`)."""
        try:
            await super().close()
        finally:
            self.smartclient_drop_updates()
            drop_socket(self)

    def fail_pending(self) -> None:
        conn = self._conn
        # why the socket ended, if it said (a TLS alert: the broker refused the client certificate)
        cause = getattr(getattr(conn, "_reader", None), "_exception", None)
        text = f"{self.host}:{self.port} closed the connection before answering" + (f" ({cause})" if cause else "")
        extra = conn.extra_waiters.values() if isinstance(conn, _NamedConnection) else ()
        for waiter in [*self._waiters.values(), *extra]:
            if not waiter.done():
                error = ConnectionResetError(text)
                error.__cause__ = cause
                waiter.set_exception(error)
                waiter.exception()  # retrieved here: one nobody awaits any more must not log "never retrieved"


#: (client, subscription id) of the chunk being handed to a callback, in the callback and in every task it starts
HANDING: ContextVar[tuple[int, int] | None] = ContextVar("smartclient_handing", default=None)


async def _handler_done(handing: asyncio.Future[None], subscriber_id: int, every: float = 10.0) -> None:
    """Wait for the application's handler to finish its chunk, however long it takes, saying so now and then."""
    waited = 0.0
    while True:
        try:
            await asyncio.wait_for(asyncio.shield(handing), every)
            return
        except asyncio.TimeoutError:
            waited += every
            log.warning("subscription %d: its delivery stops once the application's handler has finished its "
                        "chunk; waited %.0f s so far", subscriber_id, waited)


class LocatorClient(NamedClient):
    """The Environment's shared metadata connection.  rstream closes its locator after each lookup;
    this one stays open until the Environment closes it with :meth:`shutdown`."""

    async def close(self) -> None:
        return None

    async def shutdown(self) -> None:
        await super().close()



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
        raise StreamNotReady(f"{context}: the stream has no leader available yet") from exc
    except socket.gaierror as exc:
        raise ResolutionError(f"{context}: the host name could not be resolved ({exc}); "
                              f"a resolver (StaticMap, DnsResolver) can map it") from exc
    except ssl.SSLCertVerificationError as exc:
        raise CertificateRejected(f"{context}: TLS certificate verify failed: {exc.verify_message or exc}") from exc
    except asyncio.TimeoutError as exc:  # rstream's own request timeout; its message is empty
        raise ConnectionFailed(f"{context}: the broker did not answer in time") from exc
    except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
        if (alert := certificate_alert(str(exc))) is not None:  # a TLS alert, as such or as why the socket ended
            raise CertificateRejected(f"{context}: the broker refused the client certificate ({alert}): {exc}") \
                from exc
        if isinstance(exc, ssl.SSLError):
            raise ConnectionFailed(f"{context}: TLS failed: {exc}") from exc
        raise ConnectionFailed(f"{context}: {type(exc).__name__}: {exc or 'connection closed'}") from exc
    except rx.ServerError as exc:
        raise ConnectionFailed(f"{context}: the broker answered {type(exc).__name__}: {exc}") from exc


# -- connections -------------------------------------------------------------------------------------
def new_client(cls: type[Client] | None, *, host: str, port: int, tls: ssl.SSLContext | None, frame_max: int,
               heartbeat: int, name: str, on_closed: Any, max_ids: int, server_hostname: str | None,
               mechanism: str = "PLAIN", on_answer: Callable[[], None] | None = None,
               dead_after: float = 0.0) -> Client:
    """An unstarted rstream client (a :class:`NamedClient` unless ``cls`` says otherwise) logging in with SASL
    ``mechanism``; ``on_answer`` once the broker answered its first request; ``dead_after``: see ``silence.py``."""
    # a handler always: without one, rstream logs each end as an error, traceback and all ("Connection Closed Error")
    client = (cls or NamedClient)(host=host, port=port, ssl_context=tls, frame_max=frame_max, heartbeat=heartbeat,
                                  connection_name=name, connection_closed_handler=on_closed or (lambda _info: None),
                                  max_clients_by_connections=max_ids,
                                  sasl_configuration_mechanism=SlasMechanism(mechanism))
    if isinstance(client, NamedClient):
        client.server_hostname = server_hostname
        client.smartclient_on_answer = on_answer
        client.smartclient_dead_after = dead_after
    return client


async def update_secret(client: Any, username: str, secret: str) -> None:
    """Hand an open connection a new secret (a refreshed token): SaslAuthenticate again on it, which the broker
    takes as a secret update (rabbitmq-server #9187; the Java client's renewal does the same).  No SaslHandshake
    before it: on an open connection the broker answers one with Close "unknown frame".

    :raises TokenRefused: the broker refused the secret (the connection keeps the old one).
    :raises ConnectionFailed: the connection failed on the way.
    """
    context = f"updating the secret of {client._client_properties['connection_name']}"
    try:
        with map_stream_errors(context):
            await client.sync_request(
                schema.SaslAuthenticate(client._corr_id_seq.next(), mechanism="PLAIN",
                                        data=b"\0" + username.encode() + b"\0" + secret.encode()),
                resp_schema=schema.SaslAuthenticateResponse)
    except AuthenticationFailed as exc:
        raise TokenRefused(f"{context}: the broker refused the new token: {exc}") from exc


def identity(client: Any) -> tuple[Address | None, str]:
    """The node an opened connection reports (``advertised_host``/``advertised_port``), and its name."""
    props = client.server_properties or {}
    try:
        node: Address | None = Address(props["advertised_host"], int(props["advertised_port"]))
    except (KeyError, ValueError):
        node = None
    return node, str(client._client_properties["connection_name"])


def attach(client: Any, conn: Connection) -> None:
    """Let ``client`` find its :class:`Connection` (:func:`connection_of`).  Weakly: the Connection holds the
    client, and a strong reference back made each pair a cycle, so every ended connection (its socket, read
    area and TLS buffers) waited for a full collection; the Environment holds each Connection it uses."""
    client.smartclient_conn = weakref.ref(conn)


async def few_at_a_time(conn: Connection | None, subscribe: Awaitable[T]) -> T:
    """Await ``subscribe`` once ``conn`` has fewer than ``host.SUBSCRIBES_IN_FLIGHT`` others under way."""
    if conn is None:
        return await subscribe
    async with conn.subscribing:
        return await subscribe


def connection_of(client: Any) -> Connection | None:
    """The :class:`Connection` ``client`` was attached to, while the Environment still holds it."""
    ref: weakref.ref[Connection] | None = getattr(client, "smartclient_conn", None)
    return ref() if ref is not None else None


async def abort(client: Any) -> None:
    """Drop a connection without a Close handshake (it failed while opening, or its broker may not answer)."""
    try:
        for name in list(client._tasks):
            await client.stop_task(name)
    finally:  # (even if cancelled while a task stops)
        drop_socket(client)
        client._is_not_closed = False


def drop_socket(client: Any) -> None:
    """Close ``client``'s socket at once (no Close handshake, nothing more written).  Even when its transport is
    already closing: a close waits for the write buffer to drain (or TLS for the peer's answer) and a cancelled
    ``close()`` left it there, holding its descriptor; ``abort()`` twice is harmless."""
    conn = getattr(client, "_conn", None)
    if (writer := getattr(conn, "_writer", None)) is not None:
        writer.transport.abort()
    reader = getattr(conn, "_reader", None)
    if isinstance(reader, FrameReader):
        reader.release()  # its read area, now and not at the next full garbage collection


def forget_handlers(client: Any, subscription_id: int) -> None:
    """Drop a subscription's frame handlers from ``client``, and the answers to its activations still being
    worked out."""
    for frame in (schema.Deliver, schema.MetadataUpdate, schema.ConsumerUpdateResponse):
        client._handlers.get(frame, {}).pop(str(subscription_id), None)
    if isinstance(client, NamedClient):
        client.smartclient_drop_updates(str(subscription_id))


def on_metadata_update(client: Any, handler: Callable[[Any], Any], name: str) -> None:
    client.add_handler(schema.MetadataUpdate, handler, name=name)


def metadata_stream(frame: Any) -> str:
    return str(frame.metadata_info.stream)


# -- the publish path ------------------------------------------------------------------------------------
def writer_of(client: Any) -> asyncio.StreamWriter:
    """The socket writer of ``client``: the publish path writes its own Publish frames on it."""
    writer: asyncio.StreamWriter = client._conn._writer
    return writer


def socket_of(client: Any) -> Any:
    """The socket under ``client``'s connection (None if it has none)."""
    try:
        return client._conn._writer.transport.get_extra_info("socket")
    except AttributeError:
        return None


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


async def query_offset(client: Any, stream: str, name: str) -> int | None:
    """The offset stored for ``name`` on ``stream``, or None if none is."""
    try:
        return int(await client.query_offset(stream, name))
    except rx.OffsetNotFound:
        return None


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
