"""MQTT clients (paho-mqtt) placed through the resolvers, on a chosen node or any, that fail over.

paho connects to one host and, when the connection drops, reconnects to that same host.
:class:`PlacedMqttClient` is a paho ``Client`` whose every reconnect aims at the next node instead
(directly: the nodes' MQTT listeners in turn, through the resolver and the allow-list; through a load
balancer: the balancer, which picks), so a persistent session carries on on another node when its node
dies.  Placement and the node check work as for AMQP (:mod:`smartclient.node_placement`): the client id
is the name the management API lists the connection by.

TLS verifies the same name as stream connections do (:func:`smartclient.stream.tls.tls_server_name`): the
load balancer's name, the advertised node name behind a remap, or an explicit ``tls_server_name``.
"""

from __future__ import annotations

import contextlib
import logging
import select
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    SmartClientError,
)
from smartclient.core.address import Address
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import Credentials
from smartclient.mqtt.topics import validate_filter
from smartclient.node_placement import NodePlacer
from smartclient.stream.tls import tls_server_name

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike
    from smartclient.management import ManagementClient

__all__ = ["MqttOptions", "MqttPlacer", "PlacedMqttClient", "mqtt_protocol"]

log = logging.getLogger(__name__)

#: CONNACK reason codes that mean "wrong credentials or no access": never retried
_AUTH_CODES = {4, 5, 134, 135, 140}


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
        if not 0 < self.keepalive <= 65535:
            raise ConfigurationError(f"keepalive must be 1..65535 seconds, not {self.keepalive}")
        if self.session_expiry is not None and not 0 <= self.session_expiry <= 0xFFFFFFFF:
            raise ConfigurationError(f"session_expiry must be 0..4294967295 seconds, not {self.session_expiry}")
        if self.connect_timeout <= 0:
            raise ConfigurationError(f"connect_timeout must be positive, not {self.connect_timeout}")
        low, high = self.reconnect_delay
        if not 0 < low <= high:
            raise ConfigurationError(f"reconnect_delay must be (first, max) with 0 < first <= max, not {low, high}")

    @property
    def version(self) -> MQTTProtocolVersion:
        return mqtt_protocol(self.protocol)

    def connect_properties(self) -> Properties | None:
        if self.version is not MQTTProtocolVersion.MQTTv5:
            return None
        expiry = self.session_expiry if self.session_expiry is not None else (0 if self.clean_start else 86400)
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = expiry
        return props


class _NamedContext:
    """An ``SSLContext`` stand-in that makes paho verify ``server_name`` instead of the dialled host."""

    def __init__(self, context: ssl.SSLContext) -> None:
        if context.verify_mode is ssl.CERT_NONE or not context.check_hostname:
            raise ConfigurationError("smartclient does not turn TLS verification off: give a verifying SSLContext")
        self.context = context
        self.check_hostname = True
        self.server_name = ""

    def wrap_socket(self, sock: Any, server_hostname: str | None = None, **kwargs: Any) -> ssl.SSLSocket:
        return self.context.wrap_socket(sock, server_hostname=self.server_name or server_hostname, **kwargs)


class PlacedMqttClient(paho.Client):
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
        self.last_connack: tuple[bool, int] | None = None  # (session present, reason code)

    # paho's network loop (loop_start, loop_forever, loop) waits with select(), which cannot watch a file
    # descriptor numbered 1024 or more: in a process with many files or sockets the client never gets
    # its CONNACK, silently (eclipse-paho/paho.mqtt.python#183, #238, #819).  The same loop, with poll().
    def _loop(self, timeout: float = 1.0) -> MQTTErrorCode:
        sock = self._sock
        if sock is None or not hasattr(select, "poll") or timeout < 0.0:
            return super()._loop(timeout)
        pending = sock.pending() if hasattr(sock, "pending") else 0
        poller = select.poll()
        poller.register(sock, select.POLLIN | (select.POLLOUT if self.want_write() else 0))
        wake = self._sockpairR
        if wake is not None:
            poller.register(wake, select.POLLIN)
        try:
            ready = dict(poller.poll(0 if pending else int(timeout * 1000)))
        except (OSError, ValueError, TypeError):
            return super()._loop(0.0)  # a closed socket: let paho set its state and say so
        events = ready.get(sock.fileno(), 0)
        if events & (select.POLLIN | select.POLLHUP | select.POLLERR) or pending > 0:
            rc = self.loop_read()
            if rc or self._sock is None:
                return rc
        write = bool(events & select.POLLOUT)
        if wake is not None and ready.get(wake.fileno(), 0) & select.POLLIN:
            write = True  # a publish() from another thread: send it now
            with contextlib.suppress(BlockingIOError):
                wake.recv(10000)
        if write:
            rc = self.loop_write()
            if rc or self._sock is None:
                return rc
        return self.loop_misc()

    # paho calls reconnect() for the first connect too; after placement it aims at the next node
    def reconnect(self) -> MQTTErrorCode:
        if self._failover:
            self._aim_at_next_node()
        return super().reconnect()

    def _aim_at_next_node(self) -> None:
        placer = self._placer
        with self._sc_lock:
            target, node = placer.next_target(self.target)
            try:
                dialled = target if placer.via is not None else placer.resolve(target)
            except SmartClientError as exc:
                # paho's loop retries an OSError after its reconnect delay
                raise ConnectionRefusedError(f"MQTT failover to {target}: {exc}") from exc
            self.failovers += 1
            log.info("MQTT client %s: reconnecting to %s (%s) instead of %s", self._client_id.decode(),
                     node or "a node the load balancer picks", dialled, self.dialled)
            self._host, self._port = dialled.host, dialled.port
            if isinstance(self._ssl_context, _NamedContext):
                self._ssl_context.server_name = placer.server_name(target, dialled)
            self.target, self.dialled, self.node = target, dialled, node

    def _on_connack(self, session_present: bool, reason: int) -> None:
        self.last_connack = (session_present, reason)
        if reason == 0 and not session_present and self._failover:
            for topic, qos in self._subscriptions:
                self.subscribe(topic, qos)

    def __repr__(self) -> str:
        return (f"PlacedMqttClient(client_id={self._client_id.decode()!r}, node={self.node!r}, "
                f"dialled={self.dialled}, failovers={self.failovers})")


class MqttPlacer(NodePlacer[PlacedMqttClient]):
    """Opens paho MQTT clients on chosen nodes, directly through the resolver or through a load balancer.

    :param management: the management API (nodes and their MQTT listeners, and which node a client
        reached).  Optional with ``entry_points`` when no node is asked for.
    :param entry_points: MQTT listeners (``host:port``, ``mqtt://host:port``, :class:`Address`) or a
        :class:`resolvers.SrvDiscovery` (``_mqtt._tcp.example``), instead of the management API's overview.
    :param via: a load balancer's MQTT address: every connection goes through it (and is checked).
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
        credentials: Credentials | None = None,
        vhost: str = "/",
        resolver: ResolverLike | None = None,
        allow: AllowList | None = None,
        retry: RetryPolicy = RetryPolicy(),
        tls: ssl.SSLContext | None = None,
        tls_server_name: str | None = None,
        via: str | Address | None = None,
        identify_timeout: float = 10.0,
        entry_points: Any = None,
        options: MqttOptions = MqttOptions(),
    ) -> None:
        if isinstance(entry_points, str):
            entry_points = [entry_points]
        if isinstance(entry_points, list | tuple):
            entry_points = [_strip_scheme(e) if isinstance(e, str) else e for e in entry_points]
        if isinstance(via, str):
            via = _strip_scheme(via)
        if management is None and entry_points is None and via is None:
            raise ConfigurationError("MQTT needs entry_points=, via= a load balancer, or the management API")
        self.protocol = "mqtt/ssl" if tls is not None else "mqtt"
        super().__init__(management, credentials=credentials, vhost=vhost, resolver=resolver, allow=allow,
                         retry=retry, tls=tls, via=via, identify_timeout=identify_timeout, entry_points=entry_points)
        self.tls_server_name = tls_server_name
        self.options = options
        self._placing = threading.Lock()
        self._call = _Call(None, [])

    # -- where -------------------------------------------------------------------------------
    def failover_targets(self) -> list[tuple[Address, str | None]]:
        """Where a client may reconnect: the load balancer; else every node's listener (with its name), or
        the entry points when no management API can name nodes."""
        if self.via is not None:
            return [(self.via, None)]
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

    def server_name(self, target: Address, dialled: Address) -> str:
        return tls_server_name(target, dialled, self.resolver, self.tls_server_name)

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
        if (self.via is not None or node is not None) and self.management is None:
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
        v5 = opts.version is MQTTProtocolVersion.MQTTv5
        client = PlacedMqttClient(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=opts.version,
                                  clean_session=None if v5 else opts.clean_start)
        client._setup(self, subscriptions)
        user = self.credentials.username if self.vhost == "/" else f"{self.vhost}:{self.credentials.username}"
        client.username_pw_set(user, self.credentials.password)
        low, high = opts.reconnect_delay
        client.reconnect_delay_set(low, high)  # type: ignore[arg-type]  # paho sleeps floats fine
        client.connect_timeout = opts.connect_timeout
        if self.tls is not None:
            client.tls_set_context(_NamedContext(self.tls))  # type: ignore[arg-type]
        return client

    def begin_connect(self, client: PlacedMqttClient, target: Address, dialled: Address) -> None:
        """Send CONNECT to ``dialled`` (aimed at ``target``).  The TCP/TLS connect blocks, bounded by
        ``connect_timeout``; the CONNACK comes later (:attr:`PlacedMqttClient.last_connack`).

        :raises OSError: the connect failed (``ssl.SSLError`` for TLS, a certificate that does not match).
        """
        opts = self.options
        client.target, client.dialled = target, dialled
        if isinstance(client._ssl_context, _NamedContext):
            client._ssl_context.server_name = self.server_name(target, dialled)
        if opts.version is MQTTProtocolVersion.MQTTv5:
            client.connect(dialled.host, dialled.port, opts.keepalive, clean_start=opts.clean_start,
                           properties=opts.connect_properties())
        else:
            client.connect(dialled.host, dialled.port, opts.keepalive)

    def _dial(self, target: Address, dialled: Address, name: str) -> PlacedMqttClient:
        call = self._call
        client = self.new_client(name, call.subscriptions)
        if call.setup is not None:
            call.setup(client)
        _chain_on_connect(client)
        self.opened += 1
        try:
            self.begin_connect(client, target, dialled)
        except ssl.SSLCertVerificationError as exc:
            _close_quietly(client)
            raise CertificateRejected(f"connecting to {dialled} (MQTT over TLS): {exc.verify_message or exc}") from exc
        except OSError as exc:
            _close_quietly(client)
            raise ConnectionFailed(f"connecting to {dialled} (MQTT): {type(exc).__name__}: {exc}") from exc
        if not _wait_connack(client, self.options.connect_timeout):
            _close_quietly(client)
            raise ConnectionFailed(f"connecting to {dialled}: no CONNACK within {self.options.connect_timeout} s")
        reason = client.last_connack[1] if client.last_connack else -1
        if reason != 0:
            _close_quietly(client)
            text = paho.connack_string(reason) if reason < 6 else f"reason code {reason}"
            if reason in _AUTH_CODES:
                raise AuthenticationFailed(f"connecting to {dialled}: the broker refused the client ({text})")
            raise ConnectionFailed(f"connecting to {dialled}: the broker refused the client ({text})")
        return client

    def _close(self, connection: PlacedMqttClient) -> None:
        _close_quietly(connection)


@dataclass
class _Call:
    setup: Callable[[PlacedMqttClient], None] | None
    subscriptions: list[tuple[str, int]]


def _wait_connack(client: PlacedMqttClient, timeout: float) -> bool:
    """Drive the client's socket (no thread, no socket pair) until its CONNACK or ``timeout``."""
    deadline = time.monotonic() + timeout
    while client.last_connack is None:
        left = deadline - time.monotonic()
        if client.socket() is None or left <= 0:
            return False
        if client._loop(min(left, 0.1)) != paho.MQTT_ERR_SUCCESS:
            return client.last_connack is not None
    return True


def _chain_on_connect(client: PlacedMqttClient) -> None:
    """Record every CONNACK (for the dial and for re-subscribing), then call the user's on_connect."""
    user: Any = client.on_connect

    def on_connect(c: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        code = reason.value if hasattr(reason, "value") else int(reason)
        client._on_connack(bool(getattr(flags, "session_present", False)), int(code))
        if user is not None:
            user(c, userdata, flags, reason, properties)

    client.on_connect = on_connect


def _close_quietly(client: paho.Client) -> None:
    try:
        client.disconnect()
        if client._thread is None and client.socket() is not None:
            client.loop_write()  # flush the DISCONNECT
        client.loop_stop()
        client._sock_close()
    except Exception as exc:  # already broken
        log.debug("closing an MQTT client: %s", exc)


def _strip_scheme(value: str) -> str:
    for scheme in ("mqtt://", "mqtts://", "tcp://", "ssl://"):
        if value.startswith(scheme):
            return value[len(scheme):].rstrip("/")
    return value
