"""MQTT clients (paho-mqtt) placed through the resolvers, on a chosen node or any, that fail over.

paho connects to one host and, when the connection drops, reconnects to that same host.
:class:`PlacedMqttClient` is a paho ``Client`` whose every reconnect is a placement instead, driven by the
one placement loop (:class:`~smartclient.core.landing.Placement`) over the candidates of
:func:`~smartclient.core.broker_nodes.reconnect_candidates`: the other nodes in turn from the next one,
then the node it was on.  Each attempt goes through the resolution seam (the resolver and the allow-list,
or the load balancer's listener), the waits between attempts are a core :class:`~smartclient.core.retry.Backoff`,
and the node each one reached is checked (through a load balancer: its subscription's queue, or the management
API's listing of the client id, :mod:`~smartclient.mqtt.whereabouts`; directly: the target), so a persistent
session carries on on another node when its node dies.  The first placement works as for AMQP
(:mod:`smartclient.node_placement`).

TLS verifies the same name as stream connections do (:func:`smartclient.core.tls_names.tls_server_name`): the
load balancer's name, the advertised node name behind a remap, or an explicit ``tls_server_name``.

Every connect logs in through the one credentials seam, and with token credentials each client hands over to every
new token: see :mod:`smartclient.mqtt.handover`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from smartclient._errors import (
    AuthenticationFailed,
    ConfigurationError,
    NoCandidateNode,
    NodeUntold,
    PlacementError,
    SmartClientError,
)
from smartclient.core.address import Address
from smartclient.core.broker_nodes import pick_node, reconnect_candidates
from smartclient.core.landing import Placement, drive
from smartclient.core.recovery import RecoveryEvent
from smartclient.core.relogin import handover_candidates, handover_delay, slot_of_name
from smartclient.core.validation import checked
from smartclient.credentials import Refreshes
from smartclient.mqtt.handover import SETTLE_GRACE, LoginSent, MqttCredentials
from smartclient.mqtt.options import MqttOptions, mqtt_protocol
from smartclient.mqtt.placed import UNTOLD_AFTER, UNTOLD_FOR, PlacedMqttClient, Reconnecting
from smartclient.mqtt.topics import validate_filter
from smartclient.mqtt.whereabouts import subscribed_node
from smartclient.node_placement import NodePlacer
from smartclient.options import CLIENT_OPTIONS, ClientSettings, settings

if TYPE_CHECKING:
    from smartclient.management import ManagementClient

__all__ = ["MqttOptions", "MqttPlacer", "PlacedMqttClient", "mqtt_protocol"]  # (the options: mqtt/options.py)

log = logging.getLogger(__name__)

@checked({**CLIENT_OPTIONS, "options": settings(MqttOptions, optional=False)})
class MqttPlacer(NodePlacer[PlacedMqttClient]):
    """Opens paho MQTT clients on chosen nodes, directly through the resolver or through a load balancer.

    :param management: the management API (nodes and their MQTT listeners, and which node a client
        reached).  Optional with ``entry_points`` when no node is asked for.
    :param entry_points: MQTT listeners (``host:port``, ``mqtt://host:port``, :class:`Address`) or a
        :class:`resolvers.SrvDiscovery` (``_mqtt._tcp.example``), instead of the management API's overview.
    :param tls: a verifying ``ssl.SSLContext`` for the nodes' ``mqtt/ssl`` listeners.
    :param tls_server_name: the name every TLS connection verifies, instead of the one worked out.
    """

    default_port = 1883
    name_column = "client_properties.client_id"
    keep_fallbacks = False  # a second connection with the same client id takes the first over

    def __init__(self, management: ManagementClient | None = None, *, settings: ClientSettings = ClientSettings(),
                 identify_timeout: float = 10.0, entry_points: Any = None, options: MqttOptions = MqttOptions()
                 ) -> None:
        if isinstance(entry_points, str):
            entry_points = [entry_points]
        if isinstance(entry_points, list | tuple):
            entry_points = [_strip_scheme(e) if isinstance(e, str) else e for e in entry_points]
        self.protocol = "mqtt/ssl" if settings.tls is not None else "mqtt"  # the nodes' MQTTS listeners with TLS
        super().__init__(management, settings=settings, identify_timeout=identify_timeout, entry_points=entry_points)
        if management is None and entry_points is None and self.lb is None:
            raise ConfigurationError("MQTT needs entry_points=, the management API, or a load balancer resolver with "
                                     "an MQTT listener: LoadBalancer(..., mqtt=PORT)")
        self.options = options
        self.dead_after = settings.dead_after  #: seconds of silence that end a connection (TCP keepalive, user timeout)
        #: MQTT's keepalive, MqttOptions.keepalive itself: not shortened by dead_after, because a placement waits for
        #: the management API to list a new connection without pumping it, and the broker drops a client silent
        #: for 1.5 keepalives (CI, at 3 s: connections gone before they were listed); the client's own silence
        #: watch pings every dead_after / 4 s instead (PahoClient._check_keepalive)
        self.keepalive = options.keepalive
        self._placing = threading.Lock()
        self._call = _Call(None, [])
        #: presented to every node (mutual TLS, and the identity with EXTERNAL), loaded before each connect
        self.client_certificate = settings.client_certificate
        #: how every connect logs in
        self.login = MqttCredentials(self.credentials, self.vhost, self.tls, self.client_certificate)
        #: the hand-overs of the clients placed by connect() to each new token, from the first one on
        self._refreshes = Refreshes(f"the MQTT clients of {self!r}", self._hand_over_all)
        self.handovers = 0  #: connections of clients placed by connect() handed over to a new token
        self._token_checked: str | None = None  # the last token the management API took (check_token)
        #: told of every reconnect that ended (the Environment's recovery hooks: Environment.on_recovery)
        self.on_recovery: Callable[[RecoveryEvent], None] | None = None
        self.token_refusals = 0  #: new tokens the broker refused at a hand-over (the old one kept)
        self._untold_until = 0.0  # until when reconnects do not ask the listing (it went unanswered: UNTOLD_FOR)

    # -- where -------------------------------------------------------------------------------
    def targets(self) -> dict[Address, str | None]:
        """What a connection may aim at, in order: every node's listener, with the node's name (through a
        load balancer too: the balancer is what is dialled, the node what is checked); or the entry points,
        unnamed, when no management API can name nodes."""
        if self.management is None:
            return dict.fromkeys(self.entry_addresses())
        return {n.address(self.protocol): n.name for n in self.nodes() if self.protocol in n.listeners}

    def node_address(self, node: str) -> Address:
        """The listener of the node called ``node``, to check a landing against candidates (the node list
        is read again once if it is not there); a node still not listed with one stands for itself (its
        name, port 1), so a landing there is no candidate's."""
        for refresh in (False, True):
            try:
                return pick_node(self.nodes(refresh=refresh), node).address(self.protocol)
            except NoCandidateNode:
                continue
        return Address(node, 1)

    def server_name(self, target: Address, dialled: Address) -> str | None:
        """The name TLS verifies (the one resolution seam's rule)."""
        return self.resolution.tls_name(target, dialled)

    # -- connecting --------------------------------------------------------------------------
    def connect(
        self,
        client_id: str | None = None,
        node: str | None = None,
        *,
        subscriptions: Sequence[tuple[str, int]] = (),
        setup: Callable[[PlacedMqttClient], None] | None = None,
        start: bool = True,
    ) -> PlacedMqttClient:
        """A connected client on ``node`` (full or short name; any node if None), its network loop running
        on paho's thread unless ``start`` is False.  One placement at a time per placer.

        :param client_id: the MQTT client id (a unique one is made if None).  A client id already connected
            elsewhere is taken over by this connection (MQTT's rule).
        :param subscriptions: ``(topic filter, qos)`` made now, and after any reconnect without a session.
        :param setup: called with the client before it connects: set callbacks there.
        :raises NoCandidateNode: no such node.  :raises NodeUnreachable: the LB never reached it.
        :raises AuthenticationFailed: refused credentials or vhost.  :raises ConnectionFailed: no entry point
            answered.
        """
        if client_id is not None and not 0 < len(client_id.encode()) <= 65535:
            raise ConfigurationError(f"an MQTT client id must be 1..65535 bytes, not {len(client_id.encode())}")
        for topic, qos in subscriptions:
            validate_filter(topic)
            if qos not in (0, 1, 2):
                raise ConfigurationError(f"QoS must be 0, 1 or 2, not {qos!r} (for {topic!r})")
        if (self.lb is not None or node is not None) and self.management is None:
            raise ConfigurationError("placing on a node, or checking a load balancer, needs the management API")
        self.login.check(client_id or "")  # a provider that fails, an expired token: raised now, not retried
        with self._placing:
            self._call = _Call(setup, list(subscriptions))
            landed = self.place(node, client_id or self._new_name("mqtt"))
        client = landed.connection
        try:  # only on the client the application receives: not on those the placement dialled and dropped
            if setup is not None:
                setup(client)
        except BaseException:
            client.close_quietly()
            raise
        _chain_on_connect(client)
        client.node, client.attempts, client.listed_at = landed.node, landed.attempts, landed.listed_at
        client.home = self.node_address(landed.node) if landed.node is not None and self.lb is not None else (
            client.target)  # (through a load balancer: where it landed, which "any node" did not aim at)
        client._failover = True
        client.hold_while_down = True  # what it is asked to publish while it reconnects is held
        for topic, qos in subscriptions:
            client.subscribe(topic, qos)
        client.watch_afresh()
        if start:
            client.loop_start()
        self._refreshes.start(self.login.credentials)
        return client

    # -- tokens ---------------------------------------------------------------------------------------------
    def handover_drain(self) -> float:
        """Seconds a hand-over waits for the PUBACKs of the messages in flight (the connect timeout)."""
        return self.options.connect_timeout

    def handover_settle(self) -> float:
        """Seconds a hand-over reads nothing before its DISCONNECT: :data:`~smartclient.mqtt.handover.SETTLE_GRACE`
        with a persistent session, 0 with a clean start (its queue goes with the connection)."""
        return 0.0 if self.options.clean_start else SETTLE_GRACE

    def check_token(self) -> None:
        """Before a hand-over: show the new token to the management API (``/api/whoami``), which takes the same
        tokens.  One it refuses (401) is taken back there (:meth:`TokenCredentials.refused`), so the hand-over is
        skipped, with no reconnect; with no management API, the hand-over's own connect is the test."""
        tokens = self.management.tokens if self.management is not None else None
        if tokens is None or tokens is not self.credentials:
            return  # (a management API that signs in otherwise says nothing of the token)
        held = tokens.token
        if held is None or held.value == self._token_checked:
            return  # once per token, however many clients hand over to it
        try:
            self.management.get("/api/whoami")  # type: ignore[union-attr]
        except SmartClientError as exc:
            log.debug("the management API could not check the new token: %s", exc)
            return
        taken = tokens.token  # (the one before it, if the API refused it and it was taken back)
        self._token_checked = taken.value if taken is not None else None

    def _hand_over_all(self, token: str) -> None:
        """A new token: every connected client placed by :meth:`connect` hands over to it, each at its slot of the
        spread over the first half of the time its token has left (:func:`~smartclient.core.relogin.handover_delay`),
        so that the clients of an Environment do not all reconnect at once."""
        now = time.time()
        for client in self.placed_now():
            if isinstance(client, PlacedMqttClient) and client._failover and client.is_connected():
                client.hand_over_in(handover_delay(now, client.login_expires_at, slot_of_name(client.client_id)))

    def close(self) -> None:
        """Stop handing new tokens to the clients (each connection lasts until its token expires)."""
        self._refreshes.stop()

    def reconnect(self, client: PlacedMqttClient, *, handover: bool = False,
                  login: LoginSent | None = None) -> None:
        """Reconnect ``client``, whose connection dropped, as a placement over
        :func:`~smartclient.core.broker_nodes.reconnect_candidates` (the other nodes in turn, then the one it
        was on), driven by the core's loop: each attempt through the resolution seam, the node it reached
        checked (through a load balancer: identified by the management API; directly: the target), a miss
        dropped, the waits the back-off of ``options.reconnect_delay``, capped by the ``RetryPolicy``.
        Blocks (on paho's thread, where paho reconnects).  Each attempt logs in with the current credentials
        (:meth:`MqttCredentials.sign_in`), or with ``login``.  A ``handover`` (to a new token) tries the client's
        own node first (:func:`~smartclient.core.relogin.handover_candidates`); with ``login`` (the token it had,
        after the new one was refused) it takes any node: that connection lasts only until that token expires, and
        through a load balancer each miss would cost a wait for the management API's listing.

        :raises NodeUnreachable: through a load balancer, no attempt reached a candidate (and the client's
            own node did not stay reachable as the fallback).  :raises PlacementError: the policy ran out.
        :raises TokenProviderFailed: the policy ran out with the token provider failing (asked on its back-off).
        :raises AuthenticationFailed: not retried (nor are CertificateRejected and AddressNotAllowed).
        """
        nodes = self.targets()
        last = client.target
        what = f"{self.protocol} {'token hand-over' if handover else 'reconnect'} of {client.client_id}"
        own = None if login is not None else (client.home or last) if handover else last
        if handover:
            candidates = handover_candidates(tuple(nodes), own, what)
        else:  # the other nodes first, and of those, not one found cut off lately (by any wing)
            if client.lost_cut_off:  # its own PUBACK watch found it (another wing's finding is in already)
                self.cut_off.found(client.node, f"the PUBACK watch of MQTT client {client.client_id}")
            cut = self.cut_off.avoided()
            candidates = reconnect_candidates(tuple(nodes), own, what, avoid={a for a, n in nodes.items() if n in cut})
        first, most = self.options.reconnect_delay
        policy = replace(self.retry, backoff_initial=first, backoff_max=most, backoff_factor=2.0)
        # through a load balancer, after a connection that died (silent, closed, its node gone), a persistent session
        # keeps any node that answers at once: the balancer's health checks steer clear of a node it cannot reach,
        # and the listing that names its node shows a new connection only after the broker's next statistics round
        # (up to 5 s).  After the PUBACK watch (the node answers, but is cut off from its peers), for a hand-over,
        # and for a session that ends with its connection (known at once: whereabouts), each landing is checked.
        identify = (self.lb is None or handover or client.lost_cut_off or self.management is None
                    or self.options.session_ends_with_connection)  # (its subscription's queue says, at once)
        shell = Reconnecting(self, client, nodes, candidates, login, identify)
        plan: Placement[PlacedMqttClient] = Placement(candidates, policy, shell.current, holds_one=True,
                                                      untold_ok=True)
        try:
            drive(plan, shell)
        except PlacementError as exc:
            if shell.unsigned is not None:  # no attempt could even log in: the provider is why, not the nodes
                raise shell.unsigned from exc
            raise
        if shell.untold is not None:  # kept on a node the management API did not name in time
            (client.target, client.dialled), client.node = shell.untold, None
        elif shell.current.node is not None:
            client.target, client.dialled, client.node = shell.landings[shell.current.node]
        if not handover or client.home is None:
            client.home = self.node_address(client.node) if client.node is not None and self.lb is not None else (
                None if shell.untold is not None else client.target)
        client.attempts = plan.attempts
        client.watch_afresh()
        client.failovers += 0 if handover else 1
        if shell.untold is not None and self.lb is not None:
            threading.Thread(target=self._identify_later, args=(client, (client.failovers, client.handovers)),
                             name=f"mqtt-identify-{client.client_id}", daemon=True).start()
        log.info("MQTT client %s: %s to %s (%s) after %d attempts, was on %s", client.client_id,
                 "handed over" if handover else "reconnected", client.node or client.target, client.dialled,
                 plan.attempts, last)

    def _identify_later(self, client: PlacedMqttClient, placed: tuple[int, int]) -> None:
        """The node of a connection a reconnect kept without learning it, once the management API lists it (on a
        thread of its own: the listing only, which leaves the client's socket to paho's loop); told to the client
        only if it has neither reconnected nor handed over since (``placed``: its failovers and hand-overs then),
        under the lock its reconnects hold."""
        if (unanswered := self._untold_until - time.monotonic()) > 0:  # it went unanswered a moment ago: not yet
            time.sleep(unanswered)
        if (client.failovers, client.handovers) != placed:
            return
        try:
            node, listed_at = self._listing(client.client_id, None, client.listed_at, UNTOLD_AFTER)
        except Exception as exc:  # (a thread of its own: nothing to raise to; a closed management client too)
            log.info("MQTT client %s: its node is not known (%s: %s)", client.client_id, type(exc).__name__, exc)
            return
        if not client._sc_lock.acquire(timeout=5.0):  # a reconnect under way: it tells the node itself
            return
        try:
            if (client.failovers, client.handovers) == placed and client.is_connected():
                client.node, client.listed_at, client.home = node, listed_at, self.node_address(node)
        finally:
            client._sc_lock.release()

    def _reached(self, client: PlacedMqttClient, target: Address,
                 nodes: dict[Address, str | None]) -> tuple[str | None, Address]:
        """The node a reconnect reached (its name, its listener): through a load balancer, the newest listing
        of the client id by the management API; directly, the target.

        :raises NodeUntold: the listing went unanswered for :data:`UNTOLD_AFTER` s."""
        if self.lb is None:
            return nodes.get(target), target
        node, client.listed_at = self._identify(client, client.client_id, client.listed_at, UNTOLD_AFTER)
        return node, self.node_address(node)

    def _identify(self, connection: PlacedMqttClient, name: str, newer_than: int,
                  untold_after: float | None = None) -> tuple[str, int]:
        ends = self.options.session_ends_with_connection  # its subscription's queue says (whereabouts), or the listing
        node = subscribed_node(self._api().queue_node_bound, connection, self.vhost) if ends else None
        if node:
            return node, newer_than
        if untold_after is not None and time.monotonic() < self._untold_until:
            raise NodeUntold(f"the management API's connection listing went unanswered less than {UNTOLD_FOR:g} s "
                             f"ago (a node cut off?): not asked again yet")
        try:
            return self._listing(name, None, newer_than, untold_after)
        except NodeUntold:
            self._untold_until = time.monotonic() + UNTOLD_FOR
            raise

    def _new_name(self, purpose: str) -> str:
        return f"smartclient-{purpose}-{uuid.uuid4().hex[:12]}"

    def new_client(self, client_id: str, subscriptions: Sequence[tuple[str, int]] = ()) -> PlacedMqttClient:
        """A configured, unconnected client (credentials, TLS, reconnect delays, CONNACK bookkeeping)."""
        opts = self.options
        client = PlacedMqttClient.create(client_id, opts.version, opts.clean_start)
        client._setup(self, subscriptions)
        self.live.add(client)
        # paho waits nothing of its own before a reconnect: the reconnect's placement waits (reconnect()); the
        # credentials are set before each connect (sign_in)
        client.configure(None, None, reconnect_delay=(0.0, 0.0), connect_timeout=opts.connect_timeout, tls=self.tls,
                         dead_after=self.dead_after)
        return client

    def _node_if_up(self, placed: Any) -> str | None:
        return placed.node if placed.is_connected() else None

    def begin_connect(self, client: PlacedMqttClient, target: Address, dialled: Address,
                      login: LoginSent | None = None) -> None:
        """Send CONNECT to ``dialled`` (aimed at ``target``), logging in with the current credentials (or
        ``login``: see :meth:`MqttCredentials.sign_in`).  The TCP/TLS connect blocks, bounded by
        ``connect_timeout``; the CONNACK comes later (:attr:`PlacedMqttClient.last_connack`).

        :raises CertificateRejected: the certificate does not verify for the name checked.
        :raises ConnectionFailed: the connect failed (refused, reset, timed out, a TLS failure); a token provider
            that failed (:class:`TokenProviderFailed`).
        :raises TokenExpired: the provider answered a token past its expiry.
        """
        opts = self.options
        self.login.sign_in(client, login)
        client.target, client.dialled = target, dialled
        client.send_connect(dialled, self.keepalive, clean_start=opts.clean_start,
                            properties=opts.connect_properties(),
                            server_name=self.server_name(target, dialled) if self.tls is not None else None)

    def _dial(self, target: Address, dialled: Address, name: str) -> PlacedMqttClient:
        client = self.new_client(name, self._call.subscriptions)
        client.on_connect = client._connack_received  # (held while placing: told to setup's on_connect if kept)
        client._placing = True
        self.opened += 1
        try:
            self.begin_connect(client, target, dialled)
            client.await_connack(self.options.connect_timeout)
        except AuthenticationFailed as exc:
            client.close_quietly()
            raise self.login.refused(client, exc) from exc
        except BaseException:
            client.close_quietly()
            raise
        return client

    def _close(self, connection: PlacedMqttClient) -> None:
        connection.close_quietly()


@dataclass
class _Call:
    setup: Callable[[PlacedMqttClient], None] | None  # (called on the client kept: MqttPlacer.connect)
    subscriptions: list[tuple[str, int]]


def _chain_on_connect(client: PlacedMqttClient) -> None:
    """Once the placement kept ``client`` and ``setup`` has set the user's callbacks: record every CONNACK (for
    re-subscribing), then call the user's on_connect (after a reconnect: once the reconnect's placement keeps the
    connection), told now of the CONNACK of the connection kept."""
    on_connect = client.on_connect
    client._user_on_connect = None if on_connect == client._connack_received else on_connect
    client.on_connect = client._connack_received
    client._placing = False
    held, client._held = client._held, None
    if held is not None and client._user_on_connect is not None:
        client._user_on_connect(*held)


def _strip_scheme(value: str) -> str:
    schemes = ("mqtt://", "mqtts://", "tcp://", "ssl://")
    return next((value[len(s):].rstrip("/") for s in schemes if value.startswith(s)), value)
