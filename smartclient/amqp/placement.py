"""AMQP 0.9.1 connections (pika) placed on a chosen node, directly or through a load balancer.

Each connection carries a unique client-provided ``connection_name``, by which the management API says
its node (see :mod:`smartclient.node_placement` for how placing and checking work).

Each connection logs in through the one credentials seam (:mod:`smartclient.credentials`): a password, the
current OAuth2 token, or EXTERNAL (the client certificate, over the nodes' ``amqp/ssl`` listeners); the client
certificate is loaded into the TLS context before each connection, so a rotated one is used by the next.  With
token credentials, every connection the placer handed out takes each new token on the open connection
(``connection.update-secret``, :meth:`AmqpPlacer.update_secrets`).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from smartclient import credentials as signing
from smartclient._errors import (
    AuthenticationFailed,
    ConnectionFailed,
    ManagementError,
    TokenExpired,
    TokenRefused,
)
from smartclient.amqp._pika import (
    DECLARE_WITHIN,
    BlockingConnection,
    NodeCutOff,
    NodeFoundCutOff,
    close_quietly,
    open_connection,
    pika_errors,
    probe_node,
    update_secret,
    watch_close,
    watch_cut_off,
)
from smartclient.core.address import Address
from smartclient.core.relogin import refusal
from smartclient.core.validation import checked
from smartclient.credentials import CredentialsLike, TokenCredentials
from smartclient.node_placement import NodePlacer
from smartclient.options import CLIENT_OPTIONS, ClientSettings
from smartclient.options import management as check_management

if TYPE_CHECKING:
    from smartclient.management import ManagementClient

__all__ = ["AmqpPlacer", "PlacedConnection"]

_ids = itertools.count(1)
log = logging.getLogger(__name__)

#: seconds a new connection's exclusive queue may take to be declared while a node is found cut off: a landing that
#: declares nothing that long is most likely on it (a node cut from its peers takes no metadata write; through the LB,
#: a third of the landings go there), and a healthy node declares within milliseconds (DECLARE_WITHIN otherwise)
DECLARE_WHILE_CUT = 0.5


@dataclass(eq=False)
class PlacedConnection:
    """A pika ``BlockingConnection`` and where it sits.

    With token credentials it takes every new token while open: :attr:`secret_updates` counts those the broker
    accepted; :attr:`failure` says why the broker closed it, if it did (:class:`TokenRefused`: it refused a new
    token; :class:`TokenExpired`: its token expired before a new one reached it).
    """

    connection: BlockingConnection
    node: str
    dialled: Address
    name: str
    attempts: int = 1
    secret_updates: int = 0
    failure: ConnectionFailed | None = None
    #: new tokens sent and not answered yet (the broker closes the connection on one it refuses)
    pending_secrets: int = field(default=0, repr=False)
    token_on_its_way: str = field(default="", repr=False)  # the last token handed to it (told of if refused)

    def channel(self) -> Any:
        """A new pika ``BlockingChannel`` on this connection.

        :raises ConnectionFailed: the connection is closed, or the broker refused the channel.
        """
        with pika_errors(f"opening a channel on {self.node}"):
            return self.connection.channel()

    def close(self) -> None:
        close_quietly(self.connection)

    def __enter__(self) -> PlacedConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PlacedConnection(node={self.node!r}, dialled={self.dialled}, name={self.name!r})"


@checked({**CLIENT_OPTIONS, "__init__.management": partial(check_management, optional=False)})
class AmqpPlacer(NodePlacer[BlockingConnection]):
    """Opens AMQP connections on chosen nodes.

    :param management: the management API, for the nodes' listeners and to find a connection's node.
    :param identify_timeout: seconds to wait for the management API to list a new connection.
    :param entry_points: where the nodes' AMQP listeners are, instead of the management API's overview:
        ``host:port`` strings or :class:`Address` values, or a :class:`resolvers.SrvDiscovery` (e.g.
        ``_amqp._tcp.example``).  Each one is connected to once and identified with the management API.
    """

    protocol = "amqp"
    default_port = 5672
    name_column = "client_properties.connection_name"

    def __init__(self, management: ManagementClient, *, settings: ClientSettings = ClientSettings(),
                 identify_timeout: float = 10.0, entry_points: Any = None) -> None:
        if settings.tls is not None:
            self.protocol = "amqp/ssl"  # the nodes' AMQPS listeners
        super().__init__(management, settings=settings, identify_timeout=identify_timeout, entry_points=entry_points)
        self.management: ManagementClient = management
        #: pika's heartbeat timeout: the Environment's, not shortened by dead_after.  A BlockingConnection sends its
        #: heartbeats only inside pika calls, so the broker would close one left idle for two short ones
        self.heartbeat = settings.heartbeat
        self.dead_after = settings.dead_after  #: seconds of silence that end a connection (TCP keepalive, user timeout)
        self.connection_name = settings.connection_name  #: the connections' name prefix
        #: presented to every node (mutual TLS, and the identity with EXTERNAL), loaded before each connection
        self.client_certificate = settings.client_certificate
        self.login: CredentialsLike = self.credentials  #: how every connection logs in
        #: the token refreshes (token credentials), from the first connection on
        self._refreshes = signing.Refreshes(f"the AMQP connections of {self!r}", self.update_secrets)
        self.secret_updates = 0  #: new tokens the broker accepted on a live connection
        self.secret_failures = 0  #: new tokens it refused (each closes its connection: TokenRefused)

    def connect(self, node: str | None = None) -> PlacedConnection:
        """A connection on ``node`` (a full node name or the part before ``@``), or on any node if None.

        :raises NoCandidateNode: no such node, or it has no AMQP listener.
        :raises NodeUnreachable: through a load balancer, the node was never reached within the retry policy.
        :raises AuthenticationFailed: the credentials or vhost were refused (not retried).
        :raises CertificateRejected: the TLS certificate does not verify (not retried).
        """
        self._login(self.connection_name)  # a provider that fails, or an expired token: raised now, not retried
        # any node: not one found cut off lately (another first), and the connection ends once its node is found cut
        # off after it was placed, by any wing (its silence watch looks each second); one on a node asked for stays
        # there (an RPC server of that node, say: its own watch judges it)
        placed_at = time.monotonic()
        landed = self.place(node, avoid=self.cut_off.avoided())
        placed = PlacedConnection(landed.connection, str(landed.node), landed.dialled, landed.name, landed.attempts)
        watch_close(placed.connection, partial(self._closed, placed))
        if node is None and landed.node is not None:
            watch_cut_off(placed.connection, partial(self.cut_off.ends, placed.node, placed_at))
        self.live.add(placed)
        self._watch_credentials()
        return placed

    # -- logging in, and tokens refreshed on the live connections ------------------------------------------
    def _login(self, name: str) -> signing.Login:
        """What connection ``name`` logs in with (a token provider may be asked: this may block).

        :raises TokenProviderFailed: the provider failed (within its back-off it is not asked again).
        :raises TokenExpired: it answered a token already past its expiry.
        """
        return signing.login(self._credentials(), name)

    def _credentials(self) -> CredentialsLike:
        return self.login

    def _watch_credentials(self) -> None:
        """With token credentials, hand each new token to every live connection (from the first connection on)."""
        self._refreshes.start(self._credentials())

    def update_secrets(self, token: str) -> int:
        """Hand ``token`` to every open connection this placer handed out (``connection.update-secret``); return
        how many it was sent to.  It is sent from each connection's own thread, the next time that thread is in
        a pika call (see :func:`~smartclient.amqp._pika.update_secret`), and counted in :attr:`secret_updates`
        when the broker accepts it.  A refusal closes that connection (logged as :class:`TokenRefused`, counted
        in :attr:`secret_failures`, the connection's :attr:`~PlacedConnection.failure`); the others go on."""
        sent = 0
        for placed in self.placed_now():
            if not isinstance(placed, PlacedConnection) or not placed.connection.is_open:
                continue
            placed.pending_secrets += 1
            placed.token_on_its_way = token
            if update_secret(placed.connection, token, partial(self._secret_taken, placed)):
                sent += 1
            else:
                placed.pending_secrets -= 1
        return sent

    def _secret_taken(self, placed: PlacedConnection) -> None:
        placed.pending_secrets -= 1
        placed.secret_updates += 1
        self.secret_updates += 1

    def _closed(self, placed: PlacedConnection, error: ConnectionFailed | None) -> None:
        """The broker (or the application, ``error`` None) closed ``placed``: say why, if a token was the cause."""
        if error is None:
            return
        if placed.pending_secrets and not isinstance(error, TokenExpired | TokenRefused) and "(541 " in str(error):
            # 4.0.5 answers a token signed by a key it does not trust with 541 INTERNAL_ERROR, not 530 (any other
            # close while a token is on its way, a reset or a node shutting down, is what it says)
            error = TokenRefused(f"{error} (while a new token was on its way)")
        if isinstance(error, TokenRefused):
            self.secret_failures += 1
            error.connection = placed.name
            signing.refused_token(self._credentials(), placed.token_on_its_way)  # the others go on with the old one
        placed.failure = error
        if isinstance(error.__cause__, NodeCutOff) and not isinstance(error.__cause__, NodeFoundCutOff):  # its own:
            # every wing goes to other nodes first, while the partition may last
            self.cut_off.found(placed.node, f"the queue watch of AMQP connection {placed.name}")
        if isinstance(error, TokenExpired | TokenRefused):
            log.warning("AMQP connection %s on %s closed by the broker: %s", placed.name, placed.node, error)

    def close(self) -> None:
        """Stop handing new tokens to the connections (they stay open until their token expires)."""
        self._refreshes.stop()

    def _node_if_up(self, placed: Any) -> str | None:
        return placed.node if placed.connection.is_open else None

    def _new_name(self, purpose: str) -> str:
        purpose = purpose.replace("amqp/ssl", "amqps")
        return f"{self.connection_name}-{purpose}-{uuid.uuid4().hex[:8]}-{next(_ids)}"

    def _close(self, connection: BlockingConnection) -> None:
        close_quietly(connection)

    def _identify(self, connection: BlockingConnection, name: str, newer_than: int) -> tuple[str, int]:
        """The node of a new connection: that of an exclusive queue it declares.  A classic exclusive queue
        lives on the node of the connection that declared it (RabbitMQ 4.0 and 4.3, whatever the leader
        locator), and the management API shows it at once; it lists the connection itself only after its
        next statistics round (here 0.3 to 4.9 s, up to ``collect_statistics_interval``).  The queue is read
        without statistics (``disable_stats``): with them, the API gathers from every node, and while one is cut
        off (a partition, until the others give it up) each read waited for its timeout on every management node
        (20 s in all; a placement through the LB then took 30 s and failed), where this one answers at once.
        Where the queue cannot be declared (no configure permission on ``amq.gen-*``), the connection listing
        answers."""
        try:
            node = probe_node(connection, lambda queue: self._api().queue_node(self.vhost, queue),
                              DECLARE_WHILE_CUT if self.cut_off.avoided() else DECLARE_WITHIN)
        except ConnectionFailed:
            if not connection.is_open:
                raise
            node = None
        except ManagementError as exc:
            log.debug("identifying %s by a queue: %s; asking for the connection instead", name, exc)
            node = None
        return (node, -1) if node else super()._identify(connection, name, newer_than)

    def _dial(self, target: Address, dialled: Address, name: str) -> BlockingConnection:
        signed = self._login(name)
        tls = signing.tls_context(self.tls, self.client_certificate)  # a rotated certificate: loaded now
        self.opened += 1
        try:
            return open_connection(dialled, name=name, login=signed, vhost=self.vhost, heartbeat=self.heartbeat,
                                   tls=tls, tls_name=self.resolution.tls_name(target, dialled),
                                   dead_after=self.dead_after)
        except AuthenticationFailed as exc:
            creds = self._credentials()
            token = creds.token if isinstance(creds, TokenCredentials) else None
            refused = refusal(exc, time.time(), mechanism=signed.mechanism,
                              provider=creds.name if isinstance(creds, TokenCredentials) else None,
                              expires_at=token.expires_at if token is not None else None)
            raise signing.after_refusal(creds, signed, refused) from exc

