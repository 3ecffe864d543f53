"""Connections of protocols that do not say which node they reached (AMQP 0.9.1, MQTT), placed on a node.

Neither handshake names the node.  Each connection smartclient opens carries a name of its own (AMQP's
client-provided ``connection_name``, MQTT's client id); the management API lists connections with it
and their node, so a connection through a load balancer is checked, and kept or closed and retried, by
the same :class:`~smartclient.core.landing.Placement` loop as stream connections.  Directly, the
node's listener (from ``/api/overview``, from given entry points, or from DNS SRV) goes through the
resolver and the allow-list, like any address.  Through an SNI ingress (:class:`resolvers.SniRouter`) each
connection sends its node's Erlang name through the SNI rule and is checked like one through a load balancer,
but one that reached another node is misrouted: closed, counted (:attr:`NodePlacer.misrouted`), logged, and the
next candidate tried.

:class:`NodePlacer` is the protocol-free part; :class:`~smartclient.amqp.placement.AmqpPlacer` and
:class:`~smartclient.mqtt.placement.MqttPlacer` say how to dial, close and name a connection.

Sync, like pika's ``BlockingConnection`` and paho's ``Client``; an async resolver is run to completion
for each address (on a worker thread if an event loop is running in this thread).
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from smartclient._errors import (
    REFUSALS,
    ConnectionFailed,
    ManagementError,
    NodeUntold,
    SmartClientError,
)
from smartclient.core.address import Address
from smartclient.core.broker_nodes import BrokerNode, CutOffNodes, any_node_tiers, nodes_from_overview, pick_node
from smartclient.core.entry_points import EntryPoints
from smartclient.core.landing import Attempt, Keep, KeptList, Missed, Placement, Reached, Reject, drive
from smartclient.core.retry import Backoff, RetryPolicy
from smartclient.core.topology import Candidates, Role
from smartclient.core.validation import checked
from smartclient.options import CLIENT_OPTIONS, ClientSettings
from smartclient.resolution import Route, run_sync

if TYPE_CHECKING:
    from smartclient.management import ManagementClient

__all__ = ["Landed", "NodePlacer", "run_sync"]

log = logging.getLogger(__name__)

C = TypeVar("C")
T = TypeVar("T")


@dataclass(eq=False)
class Landed(Generic[C]):
    """A connection and where it sits."""

    connection: C
    node: str | None  # None: no management API to ask, and no need
    dialled: Address
    name: str
    attempts: int = 1
    listed_at: int = -1  # the management API's connected_at, when it was asked


@checked(CLIENT_OPTIONS)  # every option, when given, before anything is dialled
class NodePlacer(Generic[C]):
    """Opens connections of one protocol on chosen nodes.  Subclasses set :attr:`protocol`,
    :attr:`default_port`, :attr:`name_column` and implement :meth:`_dial` and :meth:`_close`.

    :param management: the management API, for the nodes' listeners and to find a connection's node.
    :param settings: the credentials, vhost, TLS (and the name it verifies), resolver, allow-list, retry policy and
        connection options every connection takes: an Environment's, or ``ClientSettings(...)`` made for this
        placer (a client certificate as the identity: ``credentials=EXTERNAL``).
    :param identify_timeout: seconds to wait for the management API to list a new connection (it lists
        connections after its next statistics round, up to 5 s by default).
    :param entry_points: where the nodes' listeners are, instead of the management API's overview:
        ``host:port`` strings or :class:`Address` values, or a :class:`resolvers.SrvDiscovery`.  Each one
        is connected to once and identified with the management API.
    """

    protocol: str  #: the listener protocol, as /api/overview names it ("amqp", "mqtt", "mqtt/ssl")
    default_port: ClassVar[int]
    #: the ``/api/connections`` column holding the name smartclient gave the connection
    name_column: ClassVar[str]
    #: keep a connection that reached the wrong node while trying others (False where a second
    #: connection with the same name would take the first one over, as MQTT client ids do)
    keep_fallbacks: ClassVar[bool] = True
    #: each connection names the node it reached (AMQP 1.0's Open frame): through a load balancer no management API
    #: is needed, and the nodes are known by their names alone (:meth:`named_node`)
    names_its_node: ClassVar[bool] = False

    def __init__(self, management: ManagementClient | None, *, settings: ClientSettings = ClientSettings(),
                 identify_timeout: float = 10.0, entry_points: Any = None) -> None:
        from smartclient.resolution import Resolution

        self.settings = settings  #: the one settings value (an Environment's, or one made for this placer)
        self.management = management
        self.credentials = settings.credentials
        self.vhost = settings.vhost
        self.allow = settings.allow
        self.retry = settings.retry
        self.tls = settings.tls
        self.tls_server_name = settings.tls_server_name
        # the one resolution seam: what to dial (the resolver, or the load balancer's listener for this protocol
        # when the resolver is one), which name TLS verifies
        self.resolution = Resolution(settings.resolver, settings.allow, tls=settings.tls is not None,
                                     tls_override=settings.tls_server_name, protocol=getattr(self, "protocol", None))
        self.lb = self.resolution.lb  #: the load balancer's listener every connection dials, if any (then checked)
        self.resolution.node_named = self._node_at  # an SNI rule is given the node's name, not its listener's host
        self.misrouted = 0  #: connections an SNI ingress sent to another node than the one they named (closed)
        self.resolver = self.resolution.resolver
        self.identify_timeout = identify_timeout
        self.entry_points = entry_points
        self._nodes: list[BrokerNode] | None = None
        self._named: dict[str, BrokerNode] = {}  # by name alone (see named_node)
        self.opened = 0
        self.live: weakref.WeakSet[Any] = weakref.WeakSet()  # what this placer placed (metrics: clients per node)
        #: the nodes found cut off lately, which each wing's connections there leave and new ones avoid (its own, or
        #: the one an Environment shares between its wings: what one wing finds, the others act on)
        self.cut_off = CutOffNodes()

    def placed_now(self) -> list[Any]:
        """What this placer placed that is still alive: a copy of :attr:`live`, safe from another thread (the
        token refresher's) while the application's thread places more."""
        while True:
            try:
                return list(self.live)
            except RuntimeError:  # the set changed size while it was copied: copy again
                continue

    # -- to implement ------------------------------------------------------------------------
    def _dial(self, target: Address, dialled: Address, name: str) -> C:
        """Open a connection to ``dialled`` (aimed at the node address ``target``) named ``name``.

        :raises AuthenticationFailed: refused credentials or vhost.  :raises ConnectionFailed: anything else.
        """
        raise NotImplementedError

    def _close(self, connection: C) -> None:
        raise NotImplementedError

    def _new_name(self, purpose: str) -> str:
        raise NotImplementedError

    def _node_if_up(self, placed: Any) -> str | None:
        """The node a placed client sits on, None if it is not connected now."""
        raise NotImplementedError

    def clients_per_node(self) -> Counter[str]:
        """The connected clients this placer placed, by node (read from the metrics reader's thread)."""
        for _ in range(3):  # the set may change under a reader on another thread: read it again
            try:
                return Counter(node for placed in list(self.live) if (node := self._node_if_up(placed)))
            except RuntimeError:
                continue
        return Counter()

    # -- nodes -------------------------------------------------------------------------------
    def _api(self) -> ManagementClient:
        if self.management is None:
            from smartclient._errors import ConfigurationError

            raise ConfigurationError(
                f"finding which node a {self.protocol} connection reached needs the management API "
                f"(management=ManagementClient(url, user, password))"
            )
        return self.management

    def by_name_only(self) -> bool:
        """Whether nodes are known by name alone: through a load balancer, with no management API nor entry points
        to list them, for a protocol whose connections name their node (:attr:`names_its_node`)."""
        return self.names_its_node and self.lb is not None and self.management is None and self.entry_points is None

    def named_node(self, name: str) -> BrokerNode:
        """The node called ``name`` when nodes are known by name alone: its "listener" is an address that stands
        for it (its name, port 1: through the load balancer nothing dials it), the same for its full name
        (``rabbit-2@host``) as for the short one an application gave (``rabbit-2``)."""
        node = self._named.get(name)
        if node is None:
            short = self._named.get(name.split("@", 1)[0])
            stand_in = short.listeners[self.protocol] if short is not None else Address(name, 1)
            node = self._named[name] = BrokerNode(name, {self.protocol: stand_in})
        return node

    def nodes(self, refresh: bool = False) -> list[BrokerNode]:
        """The cluster's nodes and their listeners (read once); by name alone, those named so far."""
        if self.by_name_only():
            return list(self._named.values())
        if self._nodes is None or refresh:
            if self.entry_points is None:
                self._nodes = nodes_from_overview(self._api().overview())
            else:
                self._nodes = self._identify_entry_points()
        return self._nodes

    def entry_addresses(self) -> list[Address]:
        """The entry points as addresses (a :class:`resolvers.SrvDiscovery` is asked now)."""
        if hasattr(self.entry_points, "discover"):
            return list(run_sync(self.entry_points.discover()))
        items = [self.entry_points] if isinstance(self.entry_points, str | Address) else self.entry_points
        return [a if isinstance(a, Address) else Address.parse(a, default_port=self.default_port) for a in items]

    def _identify_entry_points(self) -> list[BrokerNode]:
        """Connect once to each entry point (through the resolver) and ask the management API its node."""
        found: dict[str, dict[str, Address]] = {}
        for address in self.entry_addresses():
            dialled = self.resolve(address)
            name = self._new_name("discover")
            connection = self._dial(address, dialled, name)
            try:
                found.setdefault(self.node_of(name), {})[self.protocol] = address
            finally:
                self._close(connection)
        return [BrokerNode(node, listeners) for node, listeners in sorted(found.items())]

    def listings(self, names: Iterable[str], newer_than: Mapping[str, int] | None = None,
                 within: float | None = None) -> dict[str, tuple[str, int]]:
        """``name -> (node, connected_at)`` for each connection named in ``names`` that the management API
        lists now: the newest one, if it is newer than ``newer_than[name]`` (a ``connected_at`` seen before,
        in the broker's milliseconds).  The newest wins because an MQTT client id, reused, takes the older
        connection over; the threshold keeps a connection that is going away from passing for its successor.
        ``within``: seconds the read may take (see :meth:`ManagementClient.get`)."""
        wanted = set(names)
        floor = newer_than or {}
        best: dict[str, tuple[str, int]] = {}
        path = f"/api/connections?columns=node,connected_at,{self.name_column}"
        rows = self._api().get(path) if within is None else self._api().get(path, within=within)
        for row in rows:
            name = _column(row, self.name_column)
            if name not in wanted:
                continue
            at = int(row.get("connected_at") or 0)
            if at > floor.get(name, -1) and at >= best.get(name, ("", -1))[1]:
                best[name] = (str(row["node"]), at)
        return best

    def nodes_of(self, names: Iterable[str]) -> dict[str, str]:
        """The node of each connection named in ``names`` that the management API lists now."""
        return {name: node for name, (node, _) in self.listings(names).items()}

    def node_of(self, name: str, timeout: float | None = None, newer_than: int = -1) -> str:
        """The node the connection named ``name`` is on, per the management API (see :meth:`listings`).

        :raises ConnectionFailed: it was not listed within ``timeout`` seconds.
        """
        return self._listing(name, timeout, newer_than)[0]

    def _listing(self, name: str, timeout: float | None, newer_than: int, untold_after: float | None = None
                 ) -> tuple[str, int]:
        """See :meth:`node_of`; ``untold_after``: seconds a read of the listing may go unanswered before
        :class:`NodeUntold` is raised (None: the management client's own timeout, then ConnectionFailed)."""
        deadline = time.monotonic() + (self.identify_timeout if timeout is None else timeout)
        waits = Backoff(0.05, 1.5, 0.5)  # the management API lists a new connection within its stats round
        for polls in itertools.count(1):
            try:
                found = self.listings([name], {name: newer_than}, within=untold_after).get(name)
            except ManagementError as exc:
                if untold_after is None or exc.status is not None:
                    raise
                raise NodeUntold(
                    f"the management API did not answer which node {self.protocol} connection {name!r} reached "
                    f"within {untold_after:g} s (its listing gathers from every node, and waits while one is cut "
                    f"off): {exc}") from exc
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                break
            time.sleep(waits.delay(polls))
        raise ConnectionFailed(
            f"the management API did not list {self.protocol} connection {name!r} within the timeout"
        )

    def _identify(self, connection: C, name: str, newer_than: int) -> tuple[str, int]:
        """The node of a connection just opened through a load balancer, and when it was listed: the
        management API's connection listing (a protocol may know a quicker way)."""
        return self._listing(name, None, newer_than)

    def _node_at(self, target: Address) -> str | None:
        """The name of the node whose listener ``target`` is, from the nodes read so far (none read: None)."""
        return next((n.name for n in self._nodes or () if n.listeners.get(self.protocol) == target), None)

    def route(self, target: Address) -> Route:
        """Where a connection aimed at ``target`` goes: what to dial and which name TLS verifies."""
        return self.resolution.route_sync(target)

    def resolve(self, address: Address) -> Address:
        """What a connection aimed at ``address`` dials (the load balancer, or the resolver's answer),
        allow-listed."""
        return self.route(address).dial

    # -- connecting --------------------------------------------------------------------------
    def place(self, node: str | None = None, name: str | None = None, retry: RetryPolicy | None = None,
              avoid: Collection[str] = ()) -> Landed[C]:
        """A connection on ``node`` (a full node name or the part before ``@``), or on any node if None, within
        ``retry`` (default: the placer's; a recovery's attempt gives its own, shorter one).  Any node: one not in
        ``avoid`` (full names) first, an avoided one only as the fallback.

        :raises NoCandidateNode: no such node, or it has no listener for this protocol.
        :raises NodeUnreachable: through a load balancer, the node was never reached within the retry policy.
        :raises PlacementError: through an SNI ingress, every attempt failed (the last one's error is its cause:
            :class:`Misrouted` when the ingress sent it to another node).
        :raises AuthenticationFailed: the credentials or vhost were refused (not retried).
        :raises CertificateRejected: the certificate did not verify (through an SNI ingress, the message says the
            ingress may have misrouted the connection).
        """
        if node is None and self.lb is None and self.management is None and self.entry_points is not None:
            # any node, no way (and no need) to ask which: the first entry point that answers
            return self._first_entry_point(name)
        if self.by_name_only():
            if node is None:  # any node: the first connection through the balancer (it names its node)
                return self._first_entry_point(name, [self.lb] if self.lb is not None else [])
            self.named_node(node)
        nodes = self.nodes()
        by_address = {n.address(self.protocol): n for n in nodes if self.protocol in n.listeners}
        if node is not None:
            tiers: tuple[tuple[Address, ...], ...] = ((pick_node(nodes, node).address(self.protocol),),)
        else:
            tiers = any_node_tiers({a: n.name for a, n in by_address.items()}, avoid)
        candidates = Candidates(f"{self.protocol}:{node or 'any node'}", Role.CONNECTION, tiers)
        kept: KeptList[Landed[C]] = KeptList()
        plan: Placement[Landed[C]] = Placement(candidates, retry or self.retry, kept if self.keep_fallbacks else None)
        try:
            done = drive(plan, _Placing(self, candidates, nodes, by_address, name, kept))
            done.connection.attempts = plan.attempts
            return done.connection
        finally:
            for landed in kept.drain():
                self._close(landed.connection)

    def _first_entry_point(self, name: str | None, addresses: list[Address] | None = None) -> Landed[C]:
        entries = EntryPoints(self.entry_addresses() if addresses is None else addresses,
                              f"an {self.protocol} connection")
        while (address := entries.next_entry()) is not None:
            dialled = self.resolve(address)
            try:
                with self.resolution.routing_errors(address):
                    connection = self._dial(address, dialled, name or self._new_name(self.protocol))
            except SmartClientError as exc:
                entries.failed(address, dialled, exc)  # refusals raise at once
                continue
            return Landed(connection, None, dialled, name or "", entries.tried)
        raise entries.error()

    def _open(self, target: Address, by_address: dict[Address, BrokerNode], name: str | None,
              newer_than: int = -1) -> Landed[C]:
        dialled = self.resolve(target)
        name = name or self._new_name(self.protocol)
        connection = self._dial(target, dialled, name)
        if self.lb is None and self.resolution.by_name is None:  # directly: the node is the target's
            return Landed(connection, by_address[target].name, dialled, name)
        try:
            node, listed_at = self._identify(connection, name, newer_than)
            return Landed(connection, node, dialled, name, listed_at=listed_at)
        except BaseException:
            self._close(connection)
            raise


class _Placing(Generic[C]):
    """A node placer as the sync placement driver's shell, for one placement: how it dials and learns the node
    reached (through a load balancer or an SNI ingress, the management API's listing, or what the protocol says),
    keeps (for this placement only, or closes), rejects (closes) and sleeps."""

    def __init__(self, placer: NodePlacer[C], candidates: Candidates, nodes: list[BrokerNode],
                 by_address: dict[Address, BrokerNode], name: str | None, kept: KeptList[Landed[C]]) -> None:
        self.placer, self.candidates, self.nodes, self.by_address = placer, candidates, nodes, by_address
        self.name, self.kept = name, kept
        self.seen = -1  # the newest connected_at listed for ``name`` so far (a reused name: see listings())

    def dial(self, target: Address) -> Reached[Landed[C]] | Missed:
        placer = self.placer
        wanted = self.by_address[target].name
        try:
            with placer.resolution.routing_errors(target, wanted):
                landed = placer._open(target, self.by_address, self.name, self.seen)
        except REFUSALS:  # another node would repeat it (a failing token provider too)
            raise
        except ConnectionFailed as exc:
            return Missed(placer.resolution.listener or target, exc)
        self.seen = max(self.seen, landed.listed_at)
        reported = (placer.named_node(str(landed.node)) if placer.by_name_only()
                    else pick_node(self.nodes, str(landed.node))).address(placer.protocol)
        return Reached(landed, landed.dialled, reported, placer.resolution.routed(target, wanted, landed.node))

    def keep(self, step: Keep[Landed[C]]) -> None:
        if self.placer.keep_fallbacks:
            self.kept.put(step.node, step.connection)
        else:
            self.placer._close(step.connection.connection)

    def reject(self, step: Reject[Landed[C]]) -> None:  # an SNI ingress sent it elsewhere: never used as that node
        placer = self.placer
        placer.misrouted += 1
        log.warning("%s connection misrouted: expected %s, got %s, candidates %s: %s", placer.protocol, step.target,
                    step.node, self.candidates, step.error)
        placer._close(step.connection.connection)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def attempted(self, attempt: Attempt) -> None:
        pass


def _column(row: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        row = (row or {}).get(part) if isinstance(row, dict) else None
    return row
