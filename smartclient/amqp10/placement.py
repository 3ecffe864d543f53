"""AMQP 1.0 connections (the official ``rabbitmq-amqp-python-client``) placed on a chosen node, directly or through a
load balancer: publishers on a queue's leader, consumers on a member, stream consumers on a replica.

RabbitMQ 4 names its node in the Open frame of every AMQP 1.0 connection, so a connection through a load balancer
is checked the moment it opens, with no management API (the AMQP 0.9.1 wing has to ask the HTTP API, 0.3 to 5 s);
the same :class:`~smartclient.core.landing.Placement` loop keeps it or closes it and tries again.  A queue's
leader and members come from the broker's AMQP 1.0 management API (``GET /queues/{name}``) on a connection of
this placer: no HTTP port needed for that either.  The nodes' listeners (where to aim when not through a load
balancer) come from the HTTP management API's overview, or from ``entry_points``, each identified by its Open
frame.

The official client is synchronous (proton's blocking connection): so is this wing.  Each publisher and
consumer has its own connection; a consumer's messages are handed over on a thread of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from smartclient import _otel
from smartclient import credentials as signing
from smartclient._errors import (
    REFUSALS,
    ConfigurationError,
    ConnectionFailed,
    RecoveryFailed,
    SmartClientError,
    TopologyError,
)
from smartclient.amqp10._rabbitmq_amqp import (
    Amqp10Connection,
    QueueTopology,
    close_quietly,
    new_consumer,
    new_publisher,
    node_of,
    open_connection,
    publish,
    queue_topology,
)
from smartclient.core.address import Address
from smartclient.core.broker_nodes import BrokerNode, queue_consumer_node
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import ClientSettings, Credentials
from smartclient.core.validation import checked, choice, function, instance, provider, text, texts, whole
from smartclient.node_placement import NodePlacer
from smartclient.options import CLIENT_OPTIONS

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike
    from smartclient.management import ManagementClient

__all__ = ["CONSUMER_PREFERENCES", "Amqp10Consumer", "Amqp10Placer", "Amqp10Publisher", "PlacedAmqp10Connection"]

log = logging.getLogger(__name__)
_ids = itertools.count(1)
T = TypeVar("T")

#: where a consumer goes: "member" (any member of the queue, the least used), "replica" (a member that is not the
#: leader; the leader when there is none), "leader"
CONSUMER_PREFERENCES = ("member", "replica", "leader")
STREAM_OFFSETS = ("first", "last", "next")


def _span_attributes(queue: str, node: str, operation: str) -> dict[str, str]:
    return _otel.messaging_attributes(queue, node, operation, **{"network.protocol.name": "amqp",
                                                                   "network.protocol.version": "1.0"})


@dataclass(eq=False)
class PlacedAmqp10Connection:
    """An AMQP 1.0 connection (the official client's ``Connection``) and the node it sits on."""

    connection: Amqp10Connection
    node: str
    dialled: Address
    name: str
    attempts: int = 1
    closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            close_quietly(self.connection)

    def __enter__(self) -> PlacedAmqp10Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(eq=False)
class Amqp10Publisher:
    """A publisher to a queue, on the node of its leader.  A lost connection is recovered under the placer's
    :class:`RecoveryPolicy` (a placed reconnect on the leader, each attempt bounded by its ``attempt_time``) and
    the message sent again: at least once.  Every ``stall_check`` seconds of publishing it checks that its node
    still leads the queue, and follows a leader that moved."""

    queue: str
    placed: PlacedAmqp10Connection
    publisher: Any = field(repr=False)
    placer: Amqp10Placer = field(repr=False)
    recoveries: int = 0  #: placed reconnects after a lost connection
    moves: int = 0  #: leaders followed while the connection was fine
    _checked: float = field(default_factory=time.monotonic, repr=False)

    @property
    def node(self) -> str:
        return self.placed.node

    def publish(self, body: bytes | Any) -> None:
        """Send one message (``bytes``, or the client's ``Message``) and wait until the broker accepts it (the
        official client's only way: one message in flight).

        :raises PublishFailed: the broker rejected or released it.
        :raises RecoveryFailed: the connection was lost and recovery gave up (its last error is the cause).
        """
        check = self.placer.recovery.stall_check
        if check and time.monotonic() - self._checked >= check:
            self._follow()
        tracer = self.placer.tracer
        if tracer is None:
            self._send(body, None)
            return
        span = tracer.start(f"send {self.queue}", _otel.SpanKind.PRODUCER, _span_attributes(self.queue, self.node,
                                                                                             "send"))
        with _otel.use(span):  # the consumer's span is its child: the context goes in the application properties
            self._send(body, _otel.inject(span))

    def _send(self, body: bytes | Any, properties: dict[str, str] | None) -> None:
        try:
            publish(self.publisher, body, f"queue {self.queue!r} on {self.node}", properties)
        except ConnectionFailed as exc:
            self._recover(exc)
            publish(self.publisher, body, f"queue {self.queue!r} on {self.node}", properties)

    def _follow(self) -> None:
        self._checked = time.monotonic()
        try:
            leader = self.placer.queue_topology(self.queue).leader
        except SmartClientError as exc:
            log.debug("checking the leader of %r: %s", self.queue, exc)
            return
        if leader is not None and leader != self.node:
            log.info("the leader of %r moved from %s to %s: following it", self.queue, self.node, leader)
            try:
                moved = self.placer._publisher_on(self.queue, replace(self.placer.retry,
                                                                      max_time=self.placer.recovery.attempt_time))
            except SmartClientError as exc:  # the connection it has still works: it stays, and checks again later
                log.warning("following the leader of %r to %s failed, staying on %s: %s", self.queue, leader,
                            self.node, exc)
                return
            self._swap(*moved)
            self.moves += 1

    def _recover(self, lost: ConnectionFailed) -> None:
        log.warning("AMQP 1.0 publisher of %r lost its connection on %s: %s", self.queue, self.node, lost)
        self._swap(*self.placer.recover(f"publisher of {self.queue!r}", lost,
                                        lambda retry: self.placer._publisher_on(self.queue, retry)))
        self.recoveries += 1
        log.info("AMQP 1.0 publisher of %r recovered on %s", self.queue, self.node)

    def _swap(self, placed: PlacedAmqp10Connection, publisher: Any) -> None:
        old, self.placed, self.publisher = self.placed, placed, publisher
        old.close()

    def close(self) -> None:
        self.placed.close()

    def __enter__(self) -> Amqp10Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(eq=False)
class Amqp10Consumer:
    """A consumer of a queue on the node its preference chose; its messages are handed over on a thread of its
    own until :meth:`close`.  A lost connection is recovered under the placer's :class:`RecoveryPolicy`, on a
    node chosen again: a queue's messages not accepted yet come again (at least once); a stream is read again
    from the offset after the last one handed over.  When recovery gives up, :attr:`failure` says why."""

    queue: str
    placer: Amqp10Placer = field(repr=False)
    on_message: Callable[[Any, Callable[[], None]], None] = field(repr=False)
    prefer: str = "member"
    credit: int = 10
    offset: int | str | None = None
    filter_values: Sequence[str] = ()
    sql: str | None = None
    placed: PlacedAmqp10Connection | None = None
    failure: BaseException | None = None
    recoveries: int = 0  #: placed reconnects after a lost connection
    callback_errors: int = 0  #: messages whose callback raised (each given back to the queue)
    last_offset: int | None = None  #: a stream's last offset handed over (its callback returned)
    _handed: int = field(default=0, repr=False)  # messages handed over since the last recovery
    _fruitless: int = field(default=0, repr=False)  # recoveries in a row with nothing handed over between them
    _loop: Any = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stopping: bool = field(default=False, repr=False)

    @property
    def node(self) -> str | None:
        return self.placed.node if self.placed is not None else None

    def _hand(self, message: Any, accept: Callable[[], None], requeue: Callable[[], None]) -> None:
        """One message to the application's callback.  A callback that raises is logged and counted
        (:attr:`callback_errors`), and its message given back to the queue (unless the callback settled it): it
        comes again, never taken for a lost connection."""
        self._handed += 1
        tracer = self.placer.tracer
        try:
            if tracer is None:
                self.on_message(message, accept)
            else:
                properties = getattr(message, "application_properties", None)
                span = tracer.start(f"process {self.queue}", _otel.SpanKind.CONSUMER,
                                    _span_attributes(self.queue, str(self.node), "process"),
                                    parent=_otel.extract(properties) if isinstance(properties, dict) else None)
                with _otel.use(span):
                    self.on_message(message, accept)
        except Exception as exc:
            self.callback_errors += 1
            log.warning("the callback of the AMQP 1.0 consumer of %r raised: %s", self.queue, exc)
            with contextlib.suppress(Exception):  # it may have settled the message itself
                requeue()
            return
        annotations = getattr(message, "annotations", None)  # a stream's position: after its callback returned
        if isinstance(annotations, dict) and (offset := annotations.get("x-stream-offset")) is not None:
            self.last_offset = int(offset)

    def _open(self, retry: RetryPolicy) -> tuple[PlacedAmqp10Connection, Any]:
        node = self.placer.consumer_node(self.placer.queue_topology(self.queue), self.prefer)
        placed = self.placer.connect(node, "consumer", retry)
        start = self.offset if self.last_offset is None else self.last_offset + 1
        try:
            return placed, new_consumer(placed.connection, self.queue, self._hand, credit=self.credit, offset=start,
                                        filter_values=self.filter_values, sql=self.sql)
        except BaseException:
            placed.close()
            raise

    def start(self) -> Amqp10Consumer:
        self.placed, self._loop = self._open(self.placer.retry)
        self._thread = threading.Thread(target=self._run, name=f"amqp10-{self.placed.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            assert self.placed is not None
            try:
                self._loop.run()
                return
            except BaseException as exc:  # the client's own errors include BaseException subclasses
                if self._stopping:
                    return
                log.warning("AMQP 1.0 consumer of %r lost its connection on %s: %s", self.queue, self.node, exc)
                self.placed.close()
                self._loop.release()
                # a connection lost again with nothing handed over since the last recovery: the back-off goes on
                self._fruitless = 0 if self._handed else self._fruitless + 1
                self._handed = 0
                try:
                    self.placed, self._loop = self.placer.recover(f"consumer of {self.queue!r}", exc, self._open,
                                                                  prior=self._fruitless,
                                                                  stopping=lambda: self._stopping)
                except BaseException as final:
                    if not self._stopping:
                        self.failure = final
                        log.warning("AMQP 1.0 consumer of %r stopped: %s", self.queue, final)
                    return
                if self._stopping:  # closed while it recovered: the new connection goes too
                    self.placed.close()
                    self._loop.release()
                    return
                self.recoveries += 1
                log.info("AMQP 1.0 consumer of %r recovered on %s", self.queue, self.node)
            finally:
                if self._stopping or self.failure is not None:
                    self.placed.close()  # on this thread: proton's connection is not to be driven from two
                    self._loop.release()

    def close(self, timeout: float = 10.0) -> None:
        """Stop handing messages over and close the connection (on the consumer's thread), waiting up to
        ``timeout`` seconds for that."""
        self._stopping = True
        if self._loop is not None:
            self._loop.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("AMQP 1.0 consumer of %r on %s did not stop within %g s", self.queue, self.node, timeout)

    def __enter__(self) -> Amqp10Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@checked(CLIENT_OPTIONS)
class Amqp10Placer(NodePlacer[Amqp10Connection]):
    """Opens AMQP 1.0 connections on chosen nodes (RabbitMQ 4.0+, whose AMQP 0.9.1 listener serves AMQP 1.0).

    :param management: the HTTP management API, for the nodes' listeners (not needed through a load balancer
        with ``entry_points``, nor to check a connection's node, which its Open frame says).
    :param entry_points: where the nodes' AMQP listeners are, instead of the management API's overview:
        ``host:port`` strings or :class:`Address` values, or a :class:`resolvers.SrvDiscovery`.
    :param recovery: how publishers and consumers recover a lost connection (and how often publishers check
        that their node still leads: ``stall_check``).
    :param tracer_provider: an OpenTelemetry ``TracerProvider`` for a ``send`` span per publish (its context in the
        message's application properties) and a ``process`` span per message handed over, its child (default:
        the global one, if set).
    """

    protocol = "amqp"
    protocol_version = "1.0"  #: its clients per node are measured apart from AMQP 0.9.1's (the same listener)
    default_port = 5672
    name_column = "name"

    def __init__(
        self,
        management: ManagementClient | None = None,
        *,
        settings: ClientSettings | None = None,
        credentials: Credentials | None = None,
        vhost: str = "/",
        resolver: ResolverLike | None = None,
        allow: AllowList | None = None,
        retry: RetryPolicy = RetryPolicy(),
        tls: ssl.SSLContext | None = None,
        connection_name: str | None = None,
        entry_points: Any = None,
        recovery: RecoveryPolicy = RecoveryPolicy(),
        tracer_provider: Any = None,
    ) -> None:
        if (settings.tls if settings is not None and tls is None else tls) is not None:
            raise ConfigurationError("the AMQP 1.0 wing does not open TLS connections yet (issue 34): the official "
                                     "client takes certificate files, not an ssl.SSLContext")
        super().__init__(management, settings=settings, credentials=credentials, vhost=vhost, resolver=resolver,
                         allow=allow, retry=retry, tls=None, entry_points=entry_points)
        text("Amqp10Placer.connection_name", connection_name, optional=True)
        instance("Amqp10Placer.recovery", recovery, RecoveryPolicy, optional=False)
        provider("Amqp10Placer.tracer_provider", tracer_provider, "get_tracer", "TracerProvider")
        self.recovery = recovery
        #: a span per publish and per message handed over (the provider given, or the global one if set)
        self.tracer = _otel.tracer(tracer_provider)
        self.connection_name = connection_name or (settings.connection_name if settings is not None else "smartclient")
        self._look: PlacedAmqp10Connection | None = None  # where queues are looked up (any node)
        self._closing = False
        self._lock = threading.Lock()  # the look-up connection: one thread at a time (proton's are not shared)
        self._attempt = threading.local()  # the placement under way on this thread: its time bound
        #: seconds of silence after which a connection is taken for lost (the Environment's heartbeat)
        self.heartbeat = float(settings.heartbeat) if settings is not None else 60.0

    # -- the NodePlacer hooks -------------------------------------------------------------------
    def _dial(self, target: Address, dialled: Address, name: str) -> Amqp10Connection:
        signed = signing.login(self.credentials, name)
        self.opened += 1
        timeout = getattr(self._attempt, "seconds", self.retry.max_time)  # a recovery's attempt: its own bound
        return open_connection(dialled, login=signed, vhost=self.vhost, name=name, timeout=timeout,
                               heartbeat=self.heartbeat)

    def _identify(self, connection: Amqp10Connection, name: str, newer_than: int) -> tuple[str, int]:
        return node_of(connection), -1  # the Open frame said it: no listing to wait for

    def _identify_entry_points(self) -> list[BrokerNode]:
        found: dict[str, dict[str, Address]] = {}
        for address in self.entry_addresses():
            connection = self._dial(address, self.resolve(address), self._new_name("discover"))
            try:
                found.setdefault(node_of(connection), {})[self.protocol] = address
            finally:
                close_quietly(connection)
        return [BrokerNode(node, listeners) for node, listeners in sorted(found.items())]

    def _close(self, connection: Amqp10Connection) -> None:
        close_quietly(connection)

    def _new_name(self, purpose: str) -> str:
        return f"{self.connection_name}-amqp10-{purpose}-{uuid.uuid4().hex[:8]}-{next(_ids)}"

    def _node_if_up(self, placed: Any) -> str | None:
        return None if placed.closed else str(placed.node)

    # -- connections, publishers, consumers -----------------------------------------------------
    def connect(self, node: str | None = None, purpose: str = "connection",
                retry: RetryPolicy | None = None) -> PlacedAmqp10Connection:
        """A connection on ``node`` (a full node name or the part before ``@``), or on any node if None.

        :raises NoCandidateNode: no such node, or it has no AMQP listener.
        :raises NodeUnreachable: through a load balancer, the node was never reached within the retry policy.
        :raises AuthenticationFailed: the credentials or vhost were refused (not retried).
        """
        text("Amqp10Placer.connect(node)", node, optional=True)
        retry = retry or self.retry
        self._attempt.seconds = retry.max_time  # each dial of this placement within it (a recovery's is shorter)
        try:
            landed = self.place(node, self._new_name(purpose), retry)
        finally:
            del self._attempt.seconds
        node_name = str(landed.node) if landed.node is not None else node_of(landed.connection)
        placed = PlacedAmqp10Connection(landed.connection, node_name, landed.dialled, landed.name, landed.attempts)
        self.live.add(placed)
        return placed

    def queue_topology(self, queue: str) -> QueueTopology:
        """``queue``'s type, leader and members, from the broker's AMQP 1.0 management API.

        :raises TopologyError: the queue does not exist.
        """
        text("Amqp10Placer.queue_topology(queue)", queue)
        with self._lock:
            if self._look is None or self._look.closed:
                self._look = self.connect(purpose="look")
            look = self._look
            try:
                return queue_topology(look.connection, queue)
            except TopologyError:
                raise
            except Exception:  # the connection went: once more on a new one
                look.close()
                self._look = self.connect(purpose="look")
                return queue_topology(self._look.connection, queue)
            finally:
                if self._closing and self._look is not None:  # closed meanwhile (see close)
                    self._look.close()
                    self._look = None

    def publisher(self, queue: str) -> Amqp10Publisher:
        """A publisher to ``queue`` on its leader's node.

        :raises TopologyError: the queue does not exist, or has no leader now.
        """
        text("Amqp10Placer.publisher(queue)", queue)
        return Amqp10Publisher(queue, *self._publisher_on(queue, self.retry), placer=self)

    def _publisher_on(self, queue: str, retry: RetryPolicy) -> tuple[PlacedAmqp10Connection, Any]:
        topology = self.queue_topology(queue)
        if topology.leader is None:
            raise TopologyError(f"queue {queue!r} has no leader now")
        placed = self.connect(topology.leader, "publisher", retry)
        try:
            return placed, new_publisher(placed.connection, queue)
        except BaseException:
            placed.close()
            raise

    def consumer(self, queue: str, on_message: Callable[[Any, Callable[[], None]], None], *,
                 prefer: str = "member", credit: int = 10, offset: int | str | None = None,
                 filter_values: Sequence[str] = (), sql: str | None = None) -> Amqp10Consumer:
        """A started consumer of ``queue`` on the node ``prefer`` chooses (:data:`CONSUMER_PREFERENCES`), handing
        each message (the client's ``Message``: a binary body is a ``memoryview``) and a function that accepts
        it to ``on_message``, on the consumer's own thread.

        :param offset: a stream's start: ``"first"``, ``"last"``, ``"next"`` or an offset.
        :param filter_values: a stream's Bloom filter values (RabbitMQ 4.1+ for the official client).
        :param sql: a stream's SQL filter expression (RabbitMQ 4.2+).
        :raises TopologyError: the queue does not exist.
        :raises NoCandidateNode: it has no member to consume from.
        :raises FeatureNotSupported: the broker lacks a filter asked for.
        """
        text("Amqp10Placer.consumer(queue)", queue)
        function("Amqp10Placer.consumer(on_message)", on_message, takes="(message, accept)", optional=False)
        choice("Amqp10Placer.consumer(prefer)", prefer, CONSUMER_PREFERENCES)
        whole("Amqp10Placer.consumer(credit)", credit, low=1, high=10_000)
        if isinstance(offset, str):
            choice("Amqp10Placer.consumer(offset)", offset, STREAM_OFFSETS)
        else:
            whole("Amqp10Placer.consumer(offset)", offset, low=0, high=(1 << 63) - 1, optional=True)
        texts("Amqp10Placer.consumer(filter_values)", filter_values, empty=True, note="filter values")
        text("Amqp10Placer.consumer(sql)", sql, optional=True)
        return Amqp10Consumer(queue, self, on_message, prefer, credit, offset, tuple(filter_values), sql).start()

    def recover(self, what: str, lost: BaseException, reopen: Callable[[RetryPolicy], T], *, prior: int = 0,
                stopping: Callable[[], bool] = lambda: False) -> T:
        """``reopen(retry)`` again and again under :attr:`recovery` (each attempt placed within its
        ``attempt_time``) until it answers.  ``prior``: recoveries just before this one that did not help (the
        back-off goes on from there instead of starting again at once); ``stopping``: asked before each attempt.

        :raises RecoveryFailed: recovery is off, gave up (the last error is its cause), or ``stopping`` said so.
        :raises AuthenticationFailed: the credentials were refused (not retried).
        """
        policy, began, error = self.recovery, time.monotonic(), lost
        retry = replace(self.retry, max_time=policy.attempt_time)
        for attempt in itertools.count(1):
            done = attempt - 1 + prior
            delay = policy.next_delay(done, time.monotonic() - began) if done else 0.0
            if delay is None or not policy.enabled or stopping():
                raise RecoveryFailed(f"{what}: gave up after {attempt - 1} attempt(s) in "
                                     f"{time.monotonic() - began:.1f} s: {error}") from error
            time.sleep(delay)
            try:
                return reopen(retry)
            except REFUSALS:
                raise
            except SmartClientError as exc:
                error = exc
        raise AssertionError("unreachable")

    def consumer_node(self, topology: QueueTopology, prefer: str) -> str:
        """The node a consumer of ``topology``'s queue goes to, for ``prefer`` (the core decides)."""
        return queue_consumer_node(topology.name, topology.leader, topology.members, prefer, self.clients_per_node())

    def close(self) -> None:
        """Close the connection queues are looked up on (publishers and consumers are closed by their owners).
        Never waits: called from the Environment's ``close()`` on its event loop; a look-up under way on another
        thread closes it when done."""
        if self._lock.acquire(blocking=False):
            try:
                if self._look is not None:
                    self._look.close()
                    self._look = None
            finally:
                self._lock.release()
        else:
            self._closing = True
