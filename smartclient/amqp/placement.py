"""AMQP 0.9.1 connections (pika) placed on a chosen node, directly or through a load balancer.

Each connection carries a unique client-provided ``connection_name``, by which the management API says
its node (see :mod:`smartclient.node_placement` for how placing and checking work).
"""

from __future__ import annotations

import itertools
import logging
import ssl
import uuid
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from smartclient._errors import ConnectionFailed, ManagementError
from smartclient.amqp._pika import BlockingConnection, close_quietly, open_connection, pika_errors, probe_node
from smartclient.core.address import Address
from smartclient.core.retry import RetryPolicy
from smartclient.core.settings import ClientSettings, Credentials
from smartclient.core.validation import checked
from smartclient.node_placement import NodePlacer
from smartclient.options import CLIENT_OPTIONS
from smartclient.options import management as check_management

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike
    from smartclient.management import ManagementClient

__all__ = ["AmqpPlacer", "PlacedConnection"]

_ids = itertools.count(1)
log = logging.getLogger(__name__)


@dataclass(eq=False)
class PlacedConnection:
    """A pika ``BlockingConnection`` and where it sits."""

    connection: BlockingConnection
    node: str
    dialled: Address
    name: str
    attempts: int = 1

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

    def __init__(
        self,
        management: ManagementClient,
        *,
        settings: ClientSettings | None = None,
        credentials: Credentials | None = None,
        vhost: str = "/",
        resolver: ResolverLike | None = None,
        allow: AllowList | None = None,
        retry: RetryPolicy = RetryPolicy(),
        tls: ssl.SSLContext | None = None,
        heartbeat: int = 60,
        connection_name: str | None = None,
        identify_timeout: float = 10.0,
        entry_points: Any = None,
    ) -> None:
        super().__init__(management, settings=settings, credentials=credentials, vhost=vhost, resolver=resolver,
                         allow=allow, retry=retry, tls=tls, identify_timeout=identify_timeout,
                         entry_points=entry_points)
        self.management: ManagementClient = management
        self.heartbeat = heartbeat
        #: the connections' name prefix: given, else the settings' (an Environment's), else "smartclient"
        self.connection_name = connection_name or (settings.connection_name if settings is not None else "smartclient")

    def connect(self, node: str | None = None) -> PlacedConnection:
        """A connection on ``node`` (a full node name or the part before ``@``), or on any node if None.

        :raises NoCandidateNode: no such node, or it has no AMQP listener.
        :raises NodeUnreachable: through a load balancer, the node was never reached within the retry policy.
        :raises AuthenticationFailed: the credentials or vhost were refused (not retried).
        :raises CertificateRejected: the TLS certificate does not verify (not retried).
        """
        landed = self.place(node)
        placed = PlacedConnection(landed.connection, str(landed.node), landed.dialled, landed.name, landed.attempts)
        self.live.add(placed)
        return placed

    def _node_if_up(self, placed: Any) -> str | None:
        return placed.node if placed.connection.is_open else None

    def _new_name(self, purpose: str) -> str:
        return f"{self.connection_name}-{purpose}-{uuid.uuid4().hex[:8]}-{next(_ids)}"

    def _close(self, connection: BlockingConnection) -> None:
        close_quietly(connection)

    def _identify(self, connection: BlockingConnection, name: str, newer_than: int) -> tuple[str, int]:
        """The node of a new connection: that of an exclusive queue it declares.  A classic exclusive queue
        lives on the node of the connection that declared it (RabbitMQ 4.0 and 4.3, whatever the leader
        locator), and the management API shows it at once; it lists the connection itself only after its
        next statistics round (here 0.3 to 4.9 s, up to ``collect_statistics_interval``).  Where the queue
        cannot be declared (no configure permission on ``amq.gen-*``), the connection listing answers."""
        try:
            node = probe_node(connection, lambda queue: self._api().get(
                f"/api/queues/{quote(self.vhost, safe='')}/{quote(queue, safe='')}?columns=node"))
        except ConnectionFailed:
            if not connection.is_open:
                raise
            node = None
        except ManagementError as exc:
            log.debug("identifying %s by a queue: %s; asking for the connection instead", name, exc)
            node = None
        return (node, -1) if node else super()._identify(connection, name, newer_than)

    def _dial(self, target: Address, dialled: Address, name: str) -> BlockingConnection:
        self.opened += 1
        return open_connection(dialled, name=name, credentials=self.credentials, vhost=self.vhost,
                               heartbeat=self.heartbeat, tls=self.tls,
                               tls_name=self.resolution.tls_name(target, dialled))
