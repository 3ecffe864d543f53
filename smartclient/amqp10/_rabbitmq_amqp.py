"""The one seam between smartclient and the official AMQP 1.0 client, ``rabbitmq-amqp-python-client`` (and the
python-qpid-proton under it).  Only this module imports them, and only here do their exceptions become
smartclient's errors (:func:`amqp10_errors`).  The wing (``placement.py``) opens connections with
:func:`open_connection`, learns the node a connection reached with :func:`node_of` (the ``node`` property of the
broker's Open frame: RabbitMQ 4.0 and later, no management API needed), reads a queue's leader and members with
:func:`queue_topology` (the broker's AMQP 1.0 management API, ``GET /queues/{name}``, on the connection itself: no
HTTP port), and makes publishers and consumers with :func:`new_publisher` and :func:`new_consumer`.

What it relies on beyond the public API is listed in :data:`AMQP10_INTERNALS`; ``tests/unit/test_amqp10_seam.py``
checks every entry against the installed client and greps the library for imports of it outside this file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rabbitmq_amqp_python_client import (
    AddressHelper,
    AMQPMessagingHandler,
    Connection,
    Message,
    OffsetSpecification,
    StreamConsumerOptions,
    StreamFilterOptions,
)
from rabbitmq_amqp_python_client.exceptions import (
    AmqpMessageRejectedException,
    ArgumentOutOfRangeException,
    ValidationCodeException,
)
from rabbitmq_amqp_python_client.qpid.proton import (
    SASL,
    ConnectionException,
    Endpoint,
    ProtonException,
    SSLDomain,
    SSLException,
    Timeout,
)
from rabbitmq_amqp_python_client.qpid.proton._reactor import GlobalOverrides
from rabbitmq_amqp_python_client.qpid.proton._utils import Fetcher as _ProtonFetcher
from rabbitmq_amqp_python_client.qpid.proton.reactor import ApplicationEvent, Container, EventInjector
from rabbitmq_amqp_python_client.qpid.proton.utils import BlockingConnection, BlockingReceiver, SendException

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    FeatureNotSupported,
    PublishFailed,
    SmartClientError,
    TokenRefused,
    TopologyError,
)
from smartclient.amqp10.ca_files import CA_LOCK, ca_file_of, remove_at_exit
from smartclient.core.address import Address
from smartclient.core.redaction import install_marked_redaction, install_uri_redaction, without_uri_passwords
from smartclient.core.settings import ClientCertificate
from smartclient.credentials import Login

__all__ = [
    "AMQP10_INTERNALS",
    "Amqp10Connection",
    "ConsumerLoop",
    "QueueTopology",
    "amqp10_errors",
    "close_quietly",
    "new_consumer",
    "new_publisher",
    "node_of",
    "open_connection",
    "publish",
    "queue_topology",
    "refresh_token",
    "timed_out",
]

log = logging.getLogger(__name__)
# the client logs its connection URI, password included (closing a connection that failed, for one)
install_uri_redaction(*(f"rabbitmq_amqp_python_client.{m}" for m in ("connection", "consumer", "environment",
                                                                        "management", "publisher")), "proton")
# ... and every management request at DEBUG, a new token (PUT /auth/tokens) in its body
install_marked_redaction("rabbitmq_amqp_python_client.management", "/auth/tokens",
                         "a management request to /auth/tokens (the token is not logged)")

#: Every private attribute or method of the client the seam touches, relative to ``rabbitmq_amqp_python_client``.
AMQP10_INTERNALS: tuple[str, ...] = (
    "connection.Connection._create_connection",  # overridden: the attempt's own timeout, and the container id
    "connection.Connection._validate_server_properties",  # called as the client's own does
    "connection.Connection._conn",  # the proton BlockingConnection: its Open frame's properties (the node)
    "connection.Connection._addr",
    "qpid.proton.utils.BlockingConnection.container",  # a consumer's loop, woken from another thread to stop
    "qpid.proton.utils.BlockingConnection.disconnected",  # set, and nothing raised, when the socket went
    "connection.Connection._ssl_domain",
    # public names of proton's that the seam drives itself (closing a connection, waking a consumer's loop)
    "qpid.proton.utils.BlockingConnection.conn",
    "qpid.proton.utils.BlockingConnection.closing",
    "qpid.proton.utils.BlockingConnection.timeout",
    "qpid.proton.reactor.Container.stop_events",
    "qpid.proton._reactor",  # its GlobalOverrides: _Container sets up what proton's Container.__init__ does, less TLS
    "qpid.proton.reactor.EventInjector.pipe",
    # a blocking receiver made as proton's create_receiver makes it, with a fetcher that frees settled deliveries
    "qpid.proton.utils.BlockingConnection.create_receiver",
    "qpid.proton._utils",  # its Fetcher (what proton's create_receiver makes), subclassed
    "qpid.proton._utils.Fetcher.incoming",
    "qpid.proton._utils.Fetcher.unsettled",
    # a connection's socket, read before proton judges its idle timeout (_Container.process)
    "qpid.proton._handlers",
    "qpid.proton._handlers.IOHandler._selectable",
    "qpid.proton._selectable.Selectable._delegate",
)

#: the outcomes the official client raises for a message the broker settled without taking it: rejected, or
#: released (proton's SendException: a ProtonException, not a lost connection)
_REFUSED = (AmqpMessageRejectedException, SendException)

#: seconds a close waits for the broker's answer (it answers in milliseconds; a peer gone never does)
CLOSE_WAIT = 1.0


class _Container(Container):
    """proton's container without its default TLS configuration.  ``Container()`` builds an ``SSLConfig``, a client
    and a server SSL domain each loading the system's CA store (1.65 MiB in use and 20 to 45 ms here), for every
    blocking connection, plain ones too, to use only for an ``amqps`` URL given no domain of its own.  The seam gives
    every TLS connection its own (:func:`_ssl_domain`), so it never uses that one.  Proton skips the whole block when
    ``impl`` is given; the rest of it is set here as proton sets it (a unit test compares the two)."""

    def __init__(self) -> None:
        super().__init__(impl=None)
        self.ssl = None  # type: ignore[assignment]  # (proton's own value when TLS is unavailable)
        self.global_handler = GlobalOverrides(self.global_handler)  # type: ignore[arg-type]  # (proton's own call)
        self.trigger = None
        self.container_id = str(uuid.uuid4())
        self.allow_insecure_mechs = True
        self.allowed_mechs = None
        self.sasl_enabled = True
        self.user = None
        self.password = None
        self.smartclient_connection: Any = None  # the one connection it drives (a BlockingConnection's)
        self.smartclient_left = time.monotonic()  # when its thread last left process()

    def process(self) -> bool:
        """proton's, but a thread back from elsewhere (an idle publisher, a look-up between placements) first
        reads what waits in the socket: proton judges its idle timeout at the first event, before it reads, and
        a connection left alone longer than that, its peer's heartbeats waiting unread, was taken for silent."""
        if time.monotonic() - self.smartclient_left > 0.2:
            _read_waiting(self.smartclient_connection)
        try:
            return super().process()
        finally:
            self.smartclient_left = time.monotonic()


def _read_waiting(connection: Any) -> None:
    """Hand proton's transport what waits in ``connection``'s socket, as proton's own read does (none: nothing)."""
    transport: Any = getattr(connection, "transport", None)
    selectable: Any = getattr(transport, "_selectable", None)
    sock = getattr(selectable, "_delegate", None)
    if sock is None or selectable.is_terminal:
        return
    while (capacity := transport.capacity()) > 0:
        try:
            data = sock.recv(capacity)  # (proton's sockets do not block)
        except OSError:  # nothing waiting, or what proton's own read meets next
            return
        if not data:  # the end: proton's own read meets it
            return
        transport.push(data)


class _BlockingConnection(BlockingConnection):
    """proton's blocking connection, but one whose open fails closes its socket: proton's leaves it open when the
    open times out (a load balancer that accepted the connection for a node that does not answer), a descriptor
    and about 1.65 MiB lost for good at each such attempt."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(*args, **kwargs)
            container: Any = self.container
            container.smartclient_connection = self.conn
        except BaseException as exc:
            conn = getattr(self, "conn", None)
            transport = conn.transport if conn is not None else None
            login_taken = transport is not None and transport.sasl().outcome == SASL.OK
            shut(self, 0.0)
            if login_taken and isinstance(exc, ConnectionException) and not isinstance(exc, Timeout):
                raise ConnectionException(  # RabbitMQ closes at Open with no condition that says why
                    f"{exc}: the broker took the login, then closed the connection before opening it (the vhost "
                    f"does not exist or the user may not use it, or the node is going away)") from exc
            raise

    def create_receiver(self, address: str | None = None, credit: Any = None, dynamic: bool = False,
                        handler: Any = None, name: str | None = None, options: Any = None) -> Any:
        if handler is not None:
            return super().create_receiver(address, credit, dynamic, handler, name, options)
        blocking: Any = self  # (proton's own annotations are looser than its calls: these are its create_receiver's)
        fetcher = _Fetcher(blocking, credit)
        link = self.container.create_receiver(blocking.conn, address, name=name, dynamic=dynamic, handler=fetcher,
                                              options=options)
        return BlockingReceiver(blocking, link, fetcher, credit=credit)


class _Fetcher(_ProtonFetcher):
    """proton's fetcher for a blocking receiver, but one that frees a delivery the broker sent settled once its
    message is taken.  Proton's keeps it (unsettled on our side) until the connection goes, and then for good:
    the record that ties it to Python stays in proton's table of retained objects.  The broker's AMQP 1.0
    management API answers so: every request (a queue's topology read at each placement, a token renewed on a
    live connection) lost one delivery, about 1.7 KiB."""

    def pop(self) -> Any:
        message, delivery = self.incoming.popleft()
        if delivery.settled:  # by the broker: settling it here too frees it
            delivery.settle()
        else:
            self.unsettled.append(delivery)
        return message


def shut(blocking: Any, wait: float) -> None:
    """Close proton's blocking connection and its socket whatever state it is in, waiting at most ``wait``
    seconds for the broker's answer: the close sent, the transport closed both ways, the container driven until
    proton has closed the socket, every object freed.  Proton's own ``close()`` leaves the socket to the garbage
    collector when the peer is gone, and the official client's raises before it, closing its links first."""
    conn, container = getattr(blocking, "conn", None), getattr(blocking, "container", None)
    if conn is None or container is None:
        return
    blocking.closing = True  # no error raised from its handler any more
    try:
        conn.close()
        container.timeout = 0.05
        ends = time.monotonic() + wait
        while (conn.state & Endpoint.REMOTE_ACTIVE and conn.transport is not None and not conn.transport.closed
               and time.monotonic() < ends):
            container.process()
        if conn.transport is not None:
            conn.transport.close_tail()
            conn.transport.close_head()
        _drive(container)
    except (Exception, ValidationCodeException, ArgumentOutOfRangeException) as exc:
        log.debug("closing an AMQP 1.0 connection: %s", exc)
    finally:
        conn.free()
        conn.handler = None
        blocking.conn = None
        container.stop_events()
        container.smartclient_connection = None
        blocking.container = None


def _drive(container: Any, passes: int = 4) -> None:
    """A few short passes of ``container``'s event loop: a closed transport's socket is closed in the first."""
    container.timeout = 0.05
    for _ in range(passes):
        try:
            container.process()
        except (Exception, ValidationCodeException, ArgumentOutOfRangeException) as exc:
            log.debug("closing an AMQP 1.0 connection's socket: %s", exc)


class Amqp10Connection(Connection):
    """The official client's ``Connection``, opened with a timeout of its own (the placement attempt's, where
    the client waits 60 s) and a container id smartclient chose (how the broker names the connection).  A
    token logs in as the client's own ``oauth2_options`` would: PLAIN, the token as the password."""

    smartclient_timeout: float = 10.0
    smartclient_container: str | None = None
    smartclient_heartbeat: float | None = None
    smartclient_login: dict[str, str] = {}  # noqa: RUF012  (replaced per connection, never mutated)
    smartclient_sni: str | None = None

    def _create_connection(self) -> None:
        self._conn = _BlockingConnection(url=self._addr, timeout=self.smartclient_timeout, ssl_domain=self._ssl_domain,
                                         container=_Container(),
                                         container_id=self.smartclient_container, heartbeat=self.smartclient_heartbeat,
                                         sni=self.smartclient_sni, **self.smartclient_login)
        try:
            self._validate_server_properties()  # RabbitMQ 4.0+, or it raises
        except BaseException:
            shut(self._conn, CLOSE_WAIT)
            raise


@contextlib.contextmanager
def amqp10_errors(what: str) -> Iterator[None]:
    """Run a call into the client, its errors mapped onto smartclient's tree (``raise ... from``)."""
    try:
        yield
    except SmartClientError:
        raise
    except _REFUSED as exc:
        raise PublishFailed(f"{what}: the broker did not take it ({type(exc).__name__}): {exc}") from exc
    except (ValidationCodeException, ArgumentOutOfRangeException) as exc:  # BaseException subclasses, both
        raise ConfigurationError(f"{what}: {exc}") from exc
    except SSLException as exc:
        raise CertificateRejected(f"{what}: TLS failed: {exc}") from exc
    except Timeout as exc:
        raise ConnectionFailed(f"{what}: {without_uri_passwords(str(exc))}") from exc
    except ProtonException as exc:
        text = without_uri_passwords(str(exc))  # proton names the connection by its URI, password included
        exc.args = (text,)  # the cause, shown in a traceback, without it too
        condition = getattr(exc, "condition", None)
        name = getattr(condition, "name", "") or ""
        # a login refused: the broker's condition; "no protocol header" (a node going away under the LB) is not
        if "unauthorized-access" in name or "unauthorized-access" in text or "authentication failed" in text.lower():
            raise AuthenticationFailed(f"{what}: the broker refused the login: {text}") from exc
        if "certificate verify failed" in text or "ssl" in name.lower() or (
                "SSL Failure" in text and "alert" in text and "certificate" in text):  # ours refused by the server
            raise CertificateRejected(f"{what}: the TLS handshake failed: {text}") from exc
        raise ConnectionFailed(f"{what}: {text or type(exc).__name__}") from exc
    except OSError as exc:
        raise ConnectionFailed(f"{what}: {exc}") from exc


def open_connection(dialled: Address, *, login: Login, vhost: str, name: str, timeout: float,
                    heartbeat: float | None = None, tls: ssl.SSLContext | None = None, tls_name: str | None = None,
                    certificate: ClientCertificate | None = None) -> Amqp10Connection:
    """An open AMQP 1.0 connection to ``dialled``, logged in with ``login`` (PLAIN, or EXTERNAL: the client
    certificate's identity), on ``vhost``, the broker's name for it ``name`` (its container id), within
    ``timeout`` seconds; with ``heartbeat``, a peer silent for that long (a half-open connection) ends it.

    With ``tls``, over TLS as that context says (its CAs, whether it checks the name), sending and verifying
    ``tls_name`` (SNI), presenting ``certificate``: proton takes files, not a context (:func:`_ssl_domain`).

    :raises AuthenticationFailed: the credentials or vhost were refused.
    :raises CertificateRejected: the TLS handshake failed (the server's certificate, or ours).
    :raises ConnectionFailed: anything else (refused, reset, timed out, not RabbitMQ 4).
    """
    if login.mechanism == "EXTERNAL":
        if tls is None or certificate is None:
            raise ConfigurationError("SASL EXTERNAL logs in as the client certificate: it needs TLS and a "
                                     "client_certificate")
        sasl = {"allowed_mechs": "EXTERNAL"}
    elif login.mechanism in ("PLAIN", "AMQPLAIN"):
        # a token logs in as the password; the broker takes the user from it, but proton sends no PLAIN without one
        sasl = {"allowed_mechs": "PLAIN", "user": login.username or "token", "password": login.password}
    else:
        raise ConfigurationError(f"the AMQP 1.0 wing logs in with a user and password, a token or a client "
                                 f"certificate (EXTERNAL), not {login.mechanism}")
    path = "" if vhost == "/" else "/" + vhost  # proton quotes it into the Open frame's hostname itself
    scheme = "amqp" if tls is None else "amqps"
    connection = Amqp10Connection(uri=f"{scheme}://{dialled}{path}")  # an IPv6 host in brackets; no password
    connection.smartclient_timeout = timeout
    connection.smartclient_container = name
    connection.smartclient_heartbeat = heartbeat
    connection.smartclient_login = sasl
    with amqp10_errors(f"connecting to {dialled} ({name})"):
        if tls is not None:
            connection._ssl_domain = _ssl_domain(tls, certificate)
            connection.smartclient_sni = tls_name or dialled.host
        connection.dial()
    return connection


_TRUST_DIR: list[str] = []  # an empty directory: the only "system" CA directory proton may look in


def _ssl_domain(context: ssl.SSLContext, certificate: ClientCertificate | None) -> Any:
    """A proton TLS configuration that does what ``context`` does: the CAs it trusts, and those only (written once
    to a file of their own: proton reads only files), the peer's certificate verified (and its name, where the
    context checks names), and ``certificate`` presented.

    Proton's client configuration trusts OpenSSL's default CAs (``SSL_CTX_set_default_verify_paths``) before any
    given: for a context with CAs of its own, those defaults are pointed at its CAs while proton makes it
    (``SSL_CERT_FILE`` and ``SSL_CERT_DIR``, under a lock), so a private CA is not widened to the public ones."""
    if context.verify_mode == ssl.CERT_NONE:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
    else:
        ca_file = ca_file_of(context)
        domain = _pinned_domain(ca_file) if ca_file is not None else SSLDomain(SSLDomain.MODE_CLIENT)
        if ca_file is not None:  # else the system's CAs, proton's default
            domain.set_trusted_ca_db(ca_file)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME if context.check_hostname else
                                       SSLDomain.VERIFY_PEER, ca_file)
    if certificate is not None:
        key = certificate.key_file if certificate.key_file is not None else certificate.cert_file
        try:
            domain.set_credentials(os.fspath(certificate.cert_file), os.fspath(key), certificate.password)
        except SSLException as exc:
            raise CertificateRejected(f"the client certificate {os.fspath(certificate.cert_file)} (key "
                                      f"{os.fspath(key)}) cannot be loaded: {exc}") from exc
    return domain


def _pinned_domain(ca_file: str) -> Any:
    """A client configuration whose default CAs are ``ca_file``'s alone."""
    with CA_LOCK:
        if not _TRUST_DIR:
            _TRUST_DIR.append(remove_at_exit(tempfile.mkdtemp(prefix="smartclient-amqp10-no-ca-")))
        saved = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
        os.environ["SSL_CERT_FILE"], os.environ["SSL_CERT_DIR"] = ca_file, _TRUST_DIR[0]
        try:
            return SSLDomain(SSLDomain.MODE_CLIENT)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def node_of(connection: Amqp10Connection) -> str:
    """The node ``connection`` reached: the ``node`` property of the broker's Open frame (RabbitMQ 4.0+).

    :raises ConnectionFailed: the broker did not say (not RabbitMQ 4)."""
    proton = connection._conn.conn
    properties: Any = proton.remote_properties if proton is not None else None
    node = properties.get("node") if isinstance(properties, dict) else None
    if not node:
        raise ConnectionFailed("the broker's Open frame names no node (RabbitMQ 4.0 or later says it)")
    return str(node)


@dataclass(frozen=True)
class QueueTopology:
    """A queue's type, leader and members (node names), as the broker's AMQP 1.0 management API says them."""

    name: str
    queue_type: str
    leader: str | None
    members: tuple[str, ...]


def queue_topology(connection: Amqp10Connection, queue: str) -> QueueTopology:
    """``GET /queues/{queue}`` on the broker's AMQP 1.0 management API, over ``connection``.

    :raises TopologyError: the queue does not exist.
    """
    with amqp10_errors(f"reading queue {queue!r}"):
        answer = connection.management().request(None, AddressHelper.queue_address(queue), "GET", [200, 404])
    if str(answer.subject) == "404":
        raise TopologyError(f"queue {queue!r} does not exist")
    body: dict[str, Any] = answer.body if isinstance(answer.body, dict) else {}
    leader = body.get("leader")
    members = body.get("replicas") or ()
    return QueueTopology(queue, str(body.get("type", "")), str(leader) if leader else None,
                         tuple(sorted(str(m) for m in members)))


@contextlib.contextmanager
def _bounded(connection: Amqp10Connection, within: float | None) -> Iterator[None]:
    """``connection``'s blocking calls wait at most ``within`` seconds meanwhile (None: its own timeout)."""
    blocking: Any = connection._conn
    bound = blocking.timeout
    blocking.timeout = min(bound, within or bound)
    try:
        yield
    finally:
        blocking.timeout = bound


def refresh_token(connection: Amqp10Connection, token: str, where: str, wait: float) -> None:
    """Hand ``token`` to the broker on the live ``connection``: ``PUT /auth/tokens`` on its AMQP 1.0 management
    API (RabbitMQ 4.1+), from the thread that drives the connection, waiting at most ``wait`` seconds.

    :raises TokenRefused: the broker refused it (the connection keeps its old token until that expires).
    :raises FeatureNotSupported: the broker has no such request (RabbitMQ 4.0).
    :raises ConnectionFailed: the connection was lost, or did not answer within ``wait``.
    """
    with _bounded(connection, wait), amqp10_errors(f"renewing the token of {where}"):
        answer = connection.management().request(token.encode(), "/auth/tokens", "PUT", [204, 400, 401, 403, 404])
    code = str(answer.subject)
    if code in ("401", "403"):
        raise TokenRefused(f"the broker refused the new token on {where} ({code}): {answer.body!r}",
                           connection=where)
    if code != "204":
        raise FeatureNotSupported(f"renewing the token of {where}: the broker answered {code} to PUT /auth/tokens "
                                  f"(RabbitMQ 4.1 and later take a token on a live AMQP 1.0 connection)")


def new_publisher(connection: Amqp10Connection, queue: str) -> Any:
    with amqp10_errors(f"opening a publisher to {queue!r}"):
        return connection.publisher(AddressHelper.queue_address(queue))


def timed_out(error: BaseException) -> bool:
    """``error`` (from :func:`amqp10_errors`) is the client's own timeout: the broker answered nothing in time."""
    return isinstance(error.__cause__, Timeout)


def publish(publisher: Any, body: bytes | Any, where: str, properties: dict[str, str] | None = None) -> None:
    """Send one message and wait until the broker settles it (the official client's only way); ``properties``
    are added to its application properties (a trace context).

    :raises PublishFailed: the broker rejected or released it."""
    message: Any = body if isinstance(body, Message) else Message(body=bytes(body))
    if properties:
        message.application_properties = {**(message.application_properties or {}), **properties}
    with amqp10_errors(f"publishing to {where}"):
        publisher.publish(message)


def new_consumer(connection: Amqp10Connection, queue: str, on_message: Callable[[Any, Any, Any], None], *,
                 credit: int, offset: int | str | None = None, filter_values: Sequence[str] = (),
                 sql: str | None = None, within: float | None = None) -> ConsumerLoop:
    """A consumer of ``queue`` handing each message (the client's ``Message``, a function that settles it as
    accepted and one that gives it back to the queue) to ``on_message`` from :meth:`run`'s thread.  With
    ``offset``, ``filter_values`` or ``sql``, the queue is a stream read from that offset (``"first"``,
    ``"last"``, ``"next"`` or a number), through those filters.  Its link is attached within ``within`` seconds
    if given (the connection's timeout otherwise).

    :raises FeatureNotSupported: the broker lacks a filter asked for (SQL filters: RabbitMQ 4.2)."""

    class Handler(AMQPMessagingHandler):
        def on_amqp_message(self, event: Any) -> None:
            on_message(event.message, lambda: self.delivery_context.accept(event),
                       lambda: self.delivery_context.requeue(event))

    options = None
    if offset is not None or filter_values or sql:
        start = (getattr(OffsetSpecification, offset) if isinstance(offset, str) else
                 offset if offset is not None else OffsetSpecification.first)
        filters = (StreamFilterOptions(values=list(filter_values) or None, sql=sql or "")
                   if filter_values or sql else None)
        options = StreamConsumerOptions(offset_specification=start, filter_options=filters)
    with _bounded(connection, within), amqp10_errors(f"opening a consumer of {queue!r}"):
        try:
            consumer = connection.consumer(AddressHelper.queue_address(queue), message_handler=Handler(),
                                           consumer_options=options, credit=credit)
        except ValidationCodeException as exc:
            if "requires RabbitMQ" in str(exc):  # the client checks the broker's version for each filter
                raise FeatureNotSupported(f"consuming {queue!r}: {exc}") from exc
            raise
    return ConsumerLoop(consumer, connection._conn)


class ConsumerLoop:
    """A consumer's event loop: :meth:`run` on the thread that hands its messages over, :meth:`stop` from any
    thread.  The client's own ``run()`` and ``stop()`` end the container itself (its I/O handler dropped, so the
    connection can no longer close cleanly), and its ``stop()`` only sets a flag read after the next event, which
    an idle queue may never bring: here the loop is the container's own ``process()``, and an injected event
    wakes it to stop.  A connection that went without a close (a reset, a node killed, a heartbeat missed) only
    sets the blocking connection's ``disconnected``: the loop checks it after each pass.

    :raises ConnectionFailed: from :meth:`run`, when the connection is lost."""

    def __init__(self, consumer: Any, blocking: Any) -> None:
        self.consumer = consumer
        self.blocking = blocking
        self.container = blocking.container
        self.stopped = False
        self.released = False
        self.between: Callable[[], None] | None = None  # run on the loop's thread after each pass
        self.pipe_lock = threading.Lock()  # a wake-up never writes to the pipe once released (a reused descriptor)
        self.injector = EventInjector()
        self.container.selectable(self.injector)

    def run(self) -> None:
        try:
            with amqp10_errors("consuming"):
                while not self.stopped:
                    self.container.process()
                    if self.blocking.disconnected and not self.stopped:
                        raise ConnectionFailed("consuming: the connection was lost")
                    if self.between is not None:
                        self.between()
        finally:
            self.injector.close()

    def release(self) -> None:
        """Close the wake-up pipe (proton's injector never does), once the connection is closed: before, its
        close still drives the container, which watches the pipe."""
        with self.pipe_lock:
            if self.released:
                return
            self.released = True
            for end in self.injector.pipe:
                with contextlib.suppress(OSError):
                    os.close(end)

    def stop(self) -> None:
        self.stopped = True
        self.wake()

    def wake(self) -> None:
        """End the loop's current pass (from any thread): it runs :attr:`between`, and goes on unless stopped."""
        with self.pipe_lock:
            if not self.released:
                self.injector.trigger(ApplicationEvent("smartclient_wake"))


def close_quietly(connection: Any, wait: float = CLOSE_WAIT) -> None:
    """Close ``connection`` and its socket for sure, whatever state it is in, waiting at most ``wait`` seconds for
    the broker's answer (:func:`shut`): a connection the peer dropped (a node gone, an LB cut) keeps its socket
    half-closed otherwise, a descriptor a week-long service would leak at every loss.  Its links go with it (the
    client's own ``close()`` closes them first, and raises on a lost connection before closing it)."""
    blocking = getattr(connection, "_conn", None)
    if blocking is not None:
        shut(blocking, wait)
