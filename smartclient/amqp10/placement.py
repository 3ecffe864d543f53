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

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from smartclient import _otel, keepalive
from smartclient import credentials as signing
from smartclient._errors import (
    REFUSALS,
    AuthenticationFailed,
    NodeUnreachable,
    PlacementError,
    RecoveryFailed,
    SmartClientError,
    TopologyError,
)
from smartclient.amqp10._rabbitmq_amqp import (
    Amqp10Connection,
    QueueTopology,
    close_quietly,
    new_publisher,
    node_of,
    open_connection,
    queue_topology,
)
from smartclient.amqp10.clients import LEFT_FOR, Amqp10Consumer, Amqp10Publisher, PlacedAmqp10Connection
from smartclient.core.address import Address
from smartclient.core.broker_nodes import (
    BrokerNode,
    LeftNodes,
    Unreachable,
    queue_consumer_node,
    queue_publisher_node,
)
from smartclient.core.recovery import AttemptNow, Recovery, RecoveryEvent, RecoveryPolicy, Stop
from smartclient.core.relogin import refusal
from smartclient.core.retry import RetryPolicy
from smartclient.core.tls_names import dns_tls_name
from smartclient.core.validation import checked, choice, function, instance, provider, text, texts, whole
from smartclient.credentials import CredentialsLike, TokenCredentials
from smartclient.node_placement import NodePlacer
from smartclient.options import CLIENT_OPTIONS, ClientSettings

if TYPE_CHECKING:
    from smartclient.management import ManagementClient

__all__ = ["CONSUMER_PREFERENCES", "Amqp10Consumer", "Amqp10Placer", "Amqp10Publisher", "PlacedAmqp10Connection"]

log = logging.getLogger(__name__)
_ids = itertools.count(1)
T = TypeVar("T")

#: where a consumer goes: "member" (any member of the queue, the least used), "replica" (a member that is not the
#: leader; the leader when there is none), "leader"
CONSUMER_PREFERENCES = ("member", "replica", "leader")
STREAM_OFFSETS = ("first", "last", "next")


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
    names_its_node = True  # the Open frame: through a load balancer, no management API is needed
    default_port = 5672
    name_column = "name"

    def __init__(self, management: ManagementClient | None = None, *, settings: ClientSettings = ClientSettings(),
                 entry_points: Any = None, recovery: RecoveryPolicy = RecoveryPolicy(), tracer_provider: Any = None,
                 ) -> None:
        if settings.tls is not None:
            self.protocol = "amqp/ssl"  # the nodes' AMQPS listeners (RabbitMQ 4 serves AMQP 1.0 there too)
        super().__init__(management, settings=settings, entry_points=entry_points)
        instance("Amqp10Placer.recovery", recovery, RecoveryPolicy, optional=False)
        provider("Amqp10Placer.tracer_provider", tracer_provider, "get_tracer", "TracerProvider")
        self.recovery = recovery
        #: a span per publish and per message handed over (the provider given, or the global one if set)
        self.tracer = _otel.tracer(tracer_provider)
        self.connection_name = settings.connection_name
        #: presented to every node (mutual TLS, and the identity with EXTERNAL), read before each connection
        self.client_certificate = settings.client_certificate
        self.login: CredentialsLike = self.credentials  #: how every connection logs in
        self._refreshes = signing.Refreshes(f"the AMQP 1.0 connections of {self!r}", self.update_tokens)
        self.token_updates = 0  #: new tokens the broker took on a live connection
        #: told of every recovery that ended (the Environment's recovery hooks: Environment.on_recovery)
        self.on_recovery: Callable[[RecoveryEvent], None] | None = None
        self.token_failures = 0  #: new tokens it did not take (refused, or a broker without PUT /auth/tokens)
        self._look: PlacedAmqp10Connection | None = None  # where queues are looked up (any node)
        #: per queue, the node a publisher lost its connection on lately: its publishers go elsewhere first meanwhile
        self.left = LeftNodes(LEFT_FOR)
        self._closing = False
        self._lock = threading.Lock()  # the look-up connection: one thread at a time (proton's are not shared)
        self._attempt = threading.local()  # the placement under way on this thread: its time bound
        #: proton's idle timeout: two fifths of dead_after (keepalive.idle_timeout), the heartbeat if shorter
        self.heartbeat = keepalive.idle_timeout(settings.heartbeat, settings.dead_after)

    # -- the NodePlacer hooks -------------------------------------------------------------------
    def _dial(self, target: Address, dialled: Address, name: str) -> Amqp10Connection:
        signed = signing.login(self.login, name)
        certificate = signing.current_certificate(self.client_certificate)  # a rotated one: read now
        self.opened += 1
        timeout = getattr(self._attempt, "seconds", self.retry.max_time)  # a recovery's attempt: its own bound
        tls_name = self.resolution.tls_name(target, dialled)  # None without TLS
        if tls_name is not None and self.tls is not None and self.tls.check_hostname:
            # proton checks DNS names only: an IP is replaced by the node's host where the node is known for sure
            # (dialled directly, no name given); through a load balancer, or an IP given, the user must name one
            tls_name = dns_tls_name(tls_name, self._node_at(target) if self.resolution.reaches_target else None)
        try:
            return open_connection(dialled, login=signed, vhost=self.vhost, name=name, timeout=timeout,
                                   heartbeat=self.heartbeat, tls=self.tls, certificate=certificate, tls_name=tls_name)
        except AuthenticationFailed as exc:
            token = self.login.token if isinstance(self.login, TokenCredentials) else None
            refused = refusal(exc, time.time(), mechanism=signed.mechanism,
                              provider=self.login.name if isinstance(self.login, TokenCredentials) else None,
                              expires_at=token.expires_at if token is not None else None)
            raise signing.after_refusal(self.login, signed, refused) from exc

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
        signing.login(self.login, self.connection_name)  # a provider that fails, or an expired token: now, no retry
        retry = retry or self.retry
        self._attempt.seconds = retry.max_time  # each dial of this placement within it (a recovery's is shorter)
        try:
            landed = self.place(node, self._new_name(purpose), retry)
        finally:
            del self._attempt.seconds
        try:
            node_name = str(landed.node) if landed.node is not None else node_of(landed.connection)
        except BaseException:
            close_quietly(landed.connection)
            raise
        placed = PlacedAmqp10Connection(landed.connection, node_name, landed.dialled, landed.name, landed.attempts,
                                        placer=self)
        self.live.add(placed)
        self._refreshes.start(self.login)  # token credentials: each new token to every live connection
        return placed

    # -- tokens, renewed on the live connections ---------------------------------------------------
    def update_tokens(self, token: str) -> int:
        """Offer ``token`` to every open connection this placer placed (``PUT /auth/tokens`` on each, from the
        thread that drives it: at once when idle); return how many it was offered to.  Counted in
        :attr:`token_updates` when the broker takes it, :attr:`token_failures` when not."""
        offered = 0
        for placed in self.placed_now():
            if isinstance(placed, PlacedAmqp10Connection) and not placed.closed:
                placed.offer_token(token)
                offered += 1
        return offered

    def token_refused(self, placed: PlacedAmqp10Connection, token: str, error: SmartClientError) -> None:
        """The broker refused ``token`` on ``placed`` (which keeps its old one): every connection goes on with the
        token before it while that one is valid (:meth:`TokenCredentials.refused`)."""
        self.token_failures += 1
        log.warning("AMQP 1.0 connection %s on %s kept its old token: %s", placed.name, placed.node, error)
        if isinstance(error, AuthenticationFailed):
            signing.refused_token(self.login, token)

    def queue_topology(self, queue: str) -> QueueTopology:
        """``queue``'s type, leader and members, from the broker's AMQP 1.0 management API.

        :raises TopologyError: the queue does not exist.
        """
        text("Amqp10Placer.queue_topology(queue)", queue)
        with self._lock:
            if self._look is None or self._look.closed:
                self._look = self._looking()
            look = self._look
            try:
                return self._ask(look, queue)
            except TopologyError:
                raise
            except Exception:  # the connection went: once more on a new one
                look.close()
                self._look = self._looking()
                return self._ask(self._look, queue)
            finally:
                if self._closing and self._look is not None:  # closed meanwhile (see close)
                    self._look.close()
                    self._look = None

    def _looking(self) -> PlacedAmqp10Connection:
        look = self.connect(purpose="look")
        look.ready = True  # no link of its own to attach: new tokens may be sent to it when idle
        return look

    @staticmethod
    def _ask(look: PlacedAmqp10Connection, queue: str) -> QueueTopology:
        with look.driving():  # not driven by the token refresher meanwhile; a token it left is sent first
            return queue_topology(look.connection, queue)

    def publisher(self, queue: str) -> Amqp10Publisher:
        """A publisher to ``queue`` on its leader's node; when the load balancer never reached the leader (a node
        cut off from it), on another member, which forwards the writes to the leader (the publisher follows the
        leader back later), each member tried once.

        :raises TopologyError: the queue does not exist, or has no leader now.
        :raises NodeUnreachable: no member of the queue was reached.
        """
        text("Amqp10Placer.publisher(queue)", queue)
        unreachable = Unreachable()
        while True:
            try:
                return Amqp10Publisher(queue, *self.publisher_on(queue, self.retry, unreachable), placer=self)
            except NodeUnreachable as exc:
                if unreachable.rounds:  # every member tried
                    raise
                log.warning("AMQP 1.0 publisher of %r: %s; trying another member", queue, exc)

    def publisher_on(self, queue: str, retry: RetryPolicy, unreachable: Unreachable | None = None
                     ) -> tuple[PlacedAmqp10Connection, Any]:
        """A publisher to ``queue`` on its leader's node, or, during a recovery that could not reach it
        (``unreachable``, which this attempt updates), or while it is found cut off (by any wing) or was just lost,
        on another member: the core decides
        (:func:`~smartclient.core.broker_nodes.queue_publisher_node`)."""
        topology = self.queue_topology(queue)
        avoid = {*(unreachable.nodes if unreachable is not None else ()), *filter(None, [self.left.recent(queue)]),
                 *self.cut_off.avoided()}
        node = queue_publisher_node(queue, topology.leader, topology.members, self.clients_per_node(), avoid)
        placed = self._connect_avoiding(node, "publisher", retry, topology, unreachable)
        try:
            publisher = new_publisher(placed.connection, queue)
        except BaseException:
            placed.close()
            raise
        placed.ready = True  # its link attached: new tokens may be sent to it when idle
        return placed, publisher

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
                stopping: Callable[[], bool] = lambda: False, handle: Any = None, before: Any = None,
                after: Callable[[T], Any] = lambda reopened: None) -> T:
        """Drive the core's recovery plan (:class:`~smartclient.core.recovery.Recovery`) over :attr:`recovery`:
        ``reopen(retry)`` (each attempt placed within its ``attempt_time``) until it answers.  ``prior``: recoveries
        just before this one that did not help (the back-off goes on from there instead of starting again at once);
        ``stopping``: asked before each attempt.  :attr:`on_recovery` is told how it ended (``handle``, its node
        ``before``, and ``after(reopened)``, its node after).

        :raises RecoveryFailed: recovery is off, gave up (the last error is its cause), or ``stopping`` said so.
        :raises AuthenticationFailed: the credentials were refused (not retried).
        """
        recovery = Recovery(self.recovery, prior=prior)
        retry = replace(self.retry, max_time=self.recovery.attempt_time)
        step, node = recovery.start(str(lost)), None
        failure: BaseException | None = None
        try:
            while isinstance(step, AttemptNow):
                if stopping():
                    step = Stop(RecoveryFailed(f"stopped after {recovery.attempts - 1} attempt(s)", recovery.last))
                    break
                time.sleep(step.delay)
                try:
                    reopened = reopen(retry)
                except REFUSALS as exc:
                    failure = exc
                    raise
                except SmartClientError as exc:
                    log.warning("AMQP 1.0 %s: recovery attempt %d failed: %s", what, recovery.attempts, exc)
                    step = recovery.failed(exc)
                else:
                    node = after(reopened)
                    return reopened
            failure = RecoveryFailed(f"{what}: {step.failure}", step.failure.cause or lost)
            raise failure
        finally:
            if self.on_recovery is not None:
                self.on_recovery(RecoveryEvent(handle, "amqp10", before, node, str(lost), recovery.seconds,
                                               recovery.attempts, failure))

    def consumer_on(self, queue: str, prefer: str, retry: RetryPolicy, unreachable: Unreachable | None = None
                    ) -> PlacedAmqp10Connection:
        """A connection for a consumer of ``queue`` on the node ``prefer`` chooses, not one a recovery could not
        reach (``unreachable``, which this attempt updates) nor one found cut off (by any wing) while another will
        do: the core decides
        (:func:`~smartclient.core.broker_nodes.queue_consumer_node`)."""
        topology = self.queue_topology(queue)
        avoid = {*(unreachable.nodes if unreachable is not None else ()), *self.cut_off.avoided()}
        node = queue_consumer_node(topology.name, topology.leader, topology.members, prefer, self.clients_per_node(),
                                   avoid)
        return self._connect_avoiding(node, "consumer", retry, topology, unreachable)

    def _connect_avoiding(self, node: str, purpose: str, retry: RetryPolicy, topology: QueueTopology,
                          unreachable: Unreachable | None) -> PlacedAmqp10Connection:
        try:
            placed = self.connect(node, purpose, retry)
        except PlacementError:  # (a cut node the LB no longer routes to): another member next time, if any
            if unreachable is not None:
                unreachable.failed(node, topology.members)
            raise
        if unreachable is not None:
            unreachable.placed()
        return placed

    def consumer_node(self, topology: QueueTopology, prefer: str) -> str:
        """The node a consumer of ``topology``'s queue goes to, for ``prefer`` (the core decides)."""
        return queue_consumer_node(topology.name, topology.leader, topology.members, prefer, self.clients_per_node())

    def close(self) -> None:
        """Close the connection queues are looked up on (publishers and consumers are closed by their owners).
        Never waits: called from the Environment's ``close()`` on its event loop; a look-up under way on another
        thread closes it when done.  New tokens are no longer handed to the connections."""
        self._refreshes.stop()
        if self._lock.acquire(blocking=False):
            try:
                if self._look is not None:
                    self._look.close(wait=False)  # a token on its way to it: closed once sent
                    self._look = None
            finally:
                self._lock.release()
        else:
            self._closing = True
