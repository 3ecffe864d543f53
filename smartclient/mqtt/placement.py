"""MQTT clients (paho-mqtt) placed through the resolvers, on a chosen node or any, that fail over.

paho connects to one host and, when the connection drops, reconnects to that same host.
:class:`PlacedMqttClient` is a paho ``Client`` whose every reconnect aims at the next node instead
(directly: the nodes' MQTT listeners in turn, through the resolver and the allow-list; through a load
balancer: the balancer, which picks), so a persistent session carries on on another node when its node
dies.  Placement and the node check work as for AMQP (:mod:`smartclient.node_placement`): the client id
is the name the management API lists the connection by.

TLS verifies the same name as stream connections do (:func:`smartclient.core.tls_names.tls_server_name`): the
load balancer's name, the advertised node name behind a remap, or an explicit ``tls_server_name``.
"""

from __future__ import annotations

import logging
import ssl
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smartclient._errors import ConfigurationError
from smartclient.core.address import Address
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import ClientSettings, Credentials
from smartclient.core.validation import checked, flag, number, refuse, whole
from smartclient.mqtt._paho import MQTTProtocolVersion, PahoClient, Properties, session_properties
from smartclient.mqtt.topics import validate_filter
from smartclient.node_placement import NodePlacer
from smartclient.options import CLIENT_OPTIONS, settings

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike
    from smartclient.management import ManagementClient

__all__ = ["MqttOptions", "MqttPlacer", "PlacedMqttClient", "mqtt_protocol"]

log = logging.getLogger(__name__)


def mqtt_protocol(version: int | str) -> MQTTProtocolVersion:
    """``5``/``"5"``/``"5.0"`` -> MQTT 5; ``4``/``"3.1.1"``/``311`` -> MQTT 3.1.1.

    :raises ConfigurationError: any other version (3.1 is not supported by RabbitMQ's native MQTT)."""
    key = str(version).strip()
    if key in ("5", "5.0", "MQTTv5"):
        return MQTTProtocolVersion.MQTTv5
    if key in ("4", "3.1.1", "311", "MQTTv311"):
        return MQTTProtocolVersion.MQTTv311
    raise ConfigurationError(f"unsupported MQTT protocol version {version!r}: use 5 or '3.1.1'")


@dataclass(frozen=True)
class MqttOptions:
    """How each MQTT connection is opened.

    :param protocol: 5 or ``"3.1.1"``.
    :param keepalive: seconds between PINGREQs when idle (the broker drops the client after 1.5x).
    :param clean_start: False keeps the session (subscriptions, queued QoS 1 messages) across
        connections; with MQTT 5, ``session_expiry`` says for how long after a disconnect.
    :param session_expiry: MQTT 5 session expiry interval in seconds (None: 0 with a clean start,
        one day without).
    :param connect_timeout: seconds for the TCP/TLS connect and the CONNACK.
    :param reconnect_delay: (first, max) seconds paho waits between reconnects.
    """

    protocol: int | str = 5
    keepalive: int = 60
    clean_start: bool = True
    session_expiry: int | None = None
    connect_timeout: float = 5.0
    reconnect_delay: tuple[float, float] = (0.1, 5.0)

    def __post_init__(self) -> None:
        mqtt_protocol(self.protocol)
        whole("MqttOptions.keepalive", self.keepalive, low=1, high=65535, note="seconds")
        flag("MqttOptions.clean_start", self.clean_start)
        whole("MqttOptions.session_expiry", self.session_expiry, low=0, high=0xFFFFFFFF, optional=True, note="seconds")
        number("MqttOptions.connect_timeout", self.connect_timeout, above=0, note="seconds")
        delay = self.reconnect_delay
        if not isinstance(delay, tuple | list) or len(delay) != 2:
            refuse("MqttOptions.reconnect_delay", "(first, max) seconds", delay)
        number("MqttOptions.reconnect_delay's first", delay[0], above=0, note="seconds")
        number("MqttOptions.reconnect_delay's max", delay[1], low=delay[0], note="seconds, at least the first")

    @property
    def version(self) -> MQTTProtocolVersion:
        return mqtt_protocol(self.protocol)

    def connect_properties(self) -> Properties | None:
        if self.version is not MQTTProtocolVersion.MQTTv5:
            return None
        expiry = self.session_expiry if self.session_expiry is not None else (0 if self.clean_start else 86400)
        return session_properties(expiry)


class PlacedMqttClient(PahoClient):
    """A paho ``Client`` that knows where it sits (:attr:`node`, :attr:`dialled`) and reconnects to the next
    node rather than the same one.  Use it as any paho client: ``publish``, ``subscribe``, callbacks.
    ``subscriptions`` given to :meth:`MqttPlacer.connect` are made again after every reconnect that did not
    resume a session."""

    node: str | None
    target: Address
    dialled: Address
    attempts: int
    failovers: int

    def _setup(self, placer: MqttPlacer, subscriptions: Sequence[tuple[str, int]]) -> None:
        self._placer = placer
        self._subscriptions = list(subscriptions)
        self._failover = False
        self._sc_lock = threading.Lock()
        self.node = None
        self.failovers = 0

    # paho calls reconnect() for the first connect too; after placement every one aims at the next node
    def _before_reconnect(self) -> None:
        if self._failover:
            self._aim_at_next_node()

    def _aim_at_next_node(self) -> None:
        placer = self._placer
        with self._sc_lock:
            target, node = placer.next_target(self.target)
            route = placer.route(target)
            dialled = route.dial
            self.failovers += 1
            log.info("MQTT client %s: reconnecting to %s (%s) instead of %s", self.client_id,
                     node or "a node the load balancer picks", dialled, self.dialled)
            self.aim_at(dialled, route.tls_name)
            self.target, self.dialled, self.node = target, dialled, node

    def _on_connack(self, flags: Any, reason: Any) -> int:
        """Record a CONNACK (paho's VERSION2 ``on_connect`` arguments), re-subscribe after a reconnect that
        did not resume a session; return the reason code."""
        session_present, code = self.record_connack(flags, reason)
        if code == 0 and not session_present and self._failover:
            for topic, qos in self._subscriptions:
                self.subscribe(topic, qos)
        return code

    def __repr__(self) -> str:
        return (f"PlacedMqttClient(client_id={self.client_id!r}, node={self.node!r}, "
                f"dialled={self.dialled}, failovers={self.failovers})")


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
        tls_server_name: str | None = None,
        identify_timeout: float = 10.0,
        entry_points: Any = None,
        options: MqttOptions = MqttOptions(),
    ) -> None:
        if isinstance(entry_points, str):
            entry_points = [entry_points]
        if isinstance(entry_points, list | tuple):
            entry_points = [_strip_scheme(e) if isinstance(e, str) else e for e in entry_points]
        self.protocol = "mqtt/ssl" if tls is not None else "mqtt"
        super().__init__(management, settings=settings, credentials=credentials, vhost=vhost, resolver=resolver,
                         allow=allow, retry=retry, tls=tls, tls_server_name=tls_server_name,
                         identify_timeout=identify_timeout, entry_points=entry_points)
        if management is None and entry_points is None and self.lb is None:
            raise ConfigurationError("MQTT needs entry_points=, the management API, or a load balancer resolver with "
                                     "an MQTT listener: LoadBalancer(..., mqtt=PORT)")
        self.options = options
        self._placing = threading.Lock()
        self._call = _Call(None, [])

    # -- where -------------------------------------------------------------------------------
    def failover_targets(self) -> list[tuple[Address, str | None]]:
        """Where a client may reconnect: the load balancer; else every node's listener (with its name), or
        the entry points when no management API can name nodes."""
        if self.lb is not None:
            return [(self.lb, None)]
        if self.management is None:
            return [(a, None) for a in self.entry_addresses()]
        return [(n.address(self.protocol), n.name) for n in self.nodes() if self.protocol in n.listeners]

    def next_target(self, target: Address) -> tuple[Address, str | None]:
        """The target after ``target`` (round the list; the same one if it is alone)."""
        targets = self.failover_targets()
        for i, (address, _) in enumerate(targets):
            if address == target:
                return targets[(i + 1) % len(targets)]
        return targets[0]

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
        with self._placing:
            self._call = _Call(setup, list(subscriptions))
            landed = self.place(node, client_id or self._new_name("mqtt"))
        client = landed.connection
        client.node, client.attempts = landed.node, landed.attempts
        client._failover = True
        for topic, qos in subscriptions:
            client.subscribe(topic, qos)
        if start:
            client.loop_start()
        return client

    def _new_name(self, purpose: str) -> str:
        return f"smartclient-{purpose}-{uuid.uuid4().hex[:12]}"

    def new_client(self, client_id: str, subscriptions: Sequence[tuple[str, int]] = ()) -> PlacedMqttClient:
        """A configured, unconnected client (credentials, TLS, reconnect delays, CONNACK bookkeeping)."""
        opts = self.options
        client = PlacedMqttClient.create(client_id, opts.version, opts.clean_start)
        client._setup(self, subscriptions)
        self.live.add(client)
        user = self.credentials.username if self.vhost == "/" else f"{self.vhost}:{self.credentials.username}"
        client.configure(user, self.credentials.password, reconnect_delay=opts.reconnect_delay,
                         connect_timeout=opts.connect_timeout, tls=self.tls)
        return client

    def _node_if_up(self, placed: Any) -> str | None:
        return placed.node if placed.is_connected() else None

    def begin_connect(self, client: PlacedMqttClient, target: Address, dialled: Address) -> None:
        """Send CONNECT to ``dialled`` (aimed at ``target``).  The TCP/TLS connect blocks, bounded by
        ``connect_timeout``; the CONNACK comes later (:attr:`PlacedMqttClient.last_connack`).

        :raises CertificateRejected: the certificate does not verify for the name checked.
        :raises ConnectionFailed: the connect failed (refused, reset, timed out, a TLS failure).
        """
        opts = self.options
        client.target, client.dialled = target, dialled
        client.send_connect(dialled, opts.keepalive, clean_start=opts.clean_start,
                            properties=opts.connect_properties(),
                            server_name=self.server_name(target, dialled) if self.tls is not None else None)

    def _dial(self, target: Address, dialled: Address, name: str) -> PlacedMqttClient:
        call = self._call
        client = self.new_client(name, call.subscriptions)
        if call.setup is not None:
            call.setup(client)
        _chain_on_connect(client)
        self.opened += 1
        try:
            self.begin_connect(client, target, dialled)
            client.await_connack(self.options.connect_timeout)
        except BaseException:
            client.close_quietly()
            raise
        return client

    def _close(self, connection: PlacedMqttClient) -> None:
        connection.close_quietly()


@dataclass
class _Call:
    setup: Callable[[PlacedMqttClient], None] | None
    subscriptions: list[tuple[str, int]]


def _chain_on_connect(client: PlacedMqttClient) -> None:
    """Record every CONNACK (for the dial and for re-subscribing), then call the user's on_connect."""
    user: Any = client.on_connect

    def on_connect(c: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        client._on_connack(flags, reason)
        if user is not None:
            user(c, userdata, flags, reason, properties)

    client.on_connect = on_connect


def _strip_scheme(value: str) -> str:
    for scheme in ("mqtt://", "mqtts://", "tcp://", "ssl://"):
        if value.startswith(scheme):
            return value[len(scheme):].rstrip("/")
    return value
