"""AMQP 0.9.1 connections (pika) placed on a chosen node, directly or through a load balancer.

AMQP's handshake does not say which node a connection reached.  Each connection smartclient opens
carries a unique client-provided ``connection_name``; the management API lists connections with it and
their node, so a connection through a load balancer is checked, and kept or closed and retried, by the
same :class:`~smartclient.landing.Landing` state machine as stream connections.  Directly, the node's
AMQP listener (from ``/api/overview``) goes through the resolver and the allow-list, like any address.

Sync, like pika's ``BlockingConnection``; an async resolver is run to completion for each address.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import AuthenticationFailed, ConnectionFailed, ResolutionError
from .address import Address
from .broker_nodes import BrokerNode, nodes_from_overview, pick_node
from .landing import Decision, GiveUp, Landing, UseFallback, Wait
from .retry import RetryPolicy
from .settings import Credentials
from .topology import Candidates, Role

if TYPE_CHECKING:
    import pika

    from resolvers import AllowList, ResolverLike

    from .management import ManagementClient

__all__ = ["AmqpPlacer", "PlacedConnection"]

log = logging.getLogger(__name__)
_ids = itertools.count(1)


@dataclass(eq=False)
class PlacedConnection:
    """A pika ``BlockingConnection`` and where it sits."""

    connection: pika.BlockingConnection
    node: str
    dialled: Address
    name: str
    attempts: int = 1

    def channel(self) -> Any:
        return self.connection.channel()

    def close(self) -> None:
        if self.connection.is_open:
            try:
                self.connection.close()
            except Exception as exc:  # already broken: nothing to close
                log.debug("closing %s: %s", self.name, exc)

    def __enter__(self) -> PlacedConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PlacedConnection(node={self.node!r}, dialled={self.dialled}, name={self.name!r})"


class AmqpPlacer:
    """Opens AMQP connections on chosen nodes.

    :param management: the management API, for the nodes' listeners and to find a connection's node.
    :param via: a load balancer's AMQP address: every connection goes through it, and is checked.
    :param identify_timeout: seconds to wait for the management API to list a new connection.
    :param entry_points: where the nodes' AMQP listeners are, instead of the management API's overview:
        ``host:port`` strings or :class:`Address` values, or a :class:`resolvers.SrvDiscovery` (e.g.
        ``_amqp._tcp.example``).  Each one is connected to once and identified with the management API.
    """

    def __init__(
        self,
        management: ManagementClient,
        *,
        credentials: Credentials | None = None,
        vhost: str = "/",
        resolver: ResolverLike | None = None,
        allow: AllowList | None = None,
        retry: RetryPolicy = RetryPolicy(),
        tls: ssl.SSLContext | None = None,
        heartbeat: int = 60,
        connection_name: str = "smartclient",
        via: str | Address | None = None,
        identify_timeout: float = 10.0,
        entry_points: Any = None,
    ) -> None:
        from resolvers import Identity
        from resolvers.base import as_async

        self.management = management
        self.credentials = credentials if credentials is not None else Credentials()
        self.vhost = vhost
        self.resolver = resolver if resolver is not None else Identity()
        self._resolve = as_async(self.resolver)
        self.allow = allow
        self.retry = retry
        self.tls = tls
        self.heartbeat = heartbeat
        self.connection_name = connection_name
        self.via = Address.parse(via, default_port=5672) if isinstance(via, str) else via
        self.identify_timeout = identify_timeout
        self._nodes: list[BrokerNode] | None = None
        self.entry_points = entry_points
        self.opened = 0

    # -- nodes -------------------------------------------------------------------------------
    def nodes(self, refresh: bool = False) -> list[BrokerNode]:
        """The cluster's nodes and their listeners (read once from the management API)."""
        if self._nodes is None or refresh:
            if self.entry_points is None:
                self._nodes = nodes_from_overview(self.management.overview())
            else:
                self._nodes = self._identify_entry_points()
        return self._nodes

    def _identify_entry_points(self, protocol: str = "amqp") -> list[BrokerNode]:
        """Connect once to each entry point (through the resolver) and ask the management API its node."""
        if hasattr(self.entry_points, "discover"):
            addresses: list[Address] = list(_run(self.entry_points.discover()))
        else:
            items = [self.entry_points] if isinstance(self.entry_points, str | Address) else self.entry_points
            addresses = [a if isinstance(a, Address) else Address.parse(a, default_port=5672) for a in items]
        found: dict[str, dict[str, Address]] = {}
        for address in addresses:
            dialled = _run(self._resolve(address))
            name = f"{self.connection_name}-discover-{uuid.uuid4().hex[:8]}"
            connection = self._dial(dialled, name)
            try:
                found.setdefault(self.node_of(name), {})[protocol] = address
            finally:
                _close_quietly(connection)
        return [BrokerNode(node, listeners) for node, listeners in sorted(found.items())]

    def node_of(self, connection_name: str, timeout: float | None = None) -> str:
        """The node the connection named ``connection_name`` (client-provided) is on, per the management API.

        :raises ConnectionFailed: it was not listed within ``timeout`` seconds.
        """
        deadline = time.monotonic() + (self.identify_timeout if timeout is None else timeout)
        delay = 0.05
        while True:
            rows = self.management.get("/api/connections?columns=node,client_properties.connection_name")
            for row in rows:
                if (row.get("client_properties") or {}).get("connection_name") == connection_name:
                    return str(row["node"])
            if time.monotonic() >= deadline:
                raise ConnectionFailed(
                    f"the management API did not list connection {connection_name!r} within the timeout"
                )
            time.sleep(delay)
            delay = min(0.5, delay * 1.5)

    # -- connecting --------------------------------------------------------------------------
    def connect(self, node: str | None = None, *, protocol: str = "amqp") -> PlacedConnection:
        """A connection on ``node`` (a full node name or the part before ``@``), or on any node if None.

        :raises NoCandidateNode: no such node, or it has no AMQP listener.
        :raises NodeUnreachable: through a load balancer, the node was never reached within the retry policy.
        :raises AuthenticationFailed: the credentials or vhost were refused (not retried).
        """
        nodes = self.nodes()
        by_address = {n.address(protocol): n for n in nodes if protocol in n.listeners}
        if node is not None:
            wanted = pick_node(nodes, node)
            tiers: tuple[tuple[Address, ...], ...] = ((wanted.address(protocol),),)
        else:
            tiers = (tuple(by_address),)
        candidates = Candidates(f"{protocol}:{node or 'any node'}", Role.CONNECTION, tiers)
        landing = Landing(candidates, self.retry)
        kept: list[PlacedConnection] = []
        try:
            while True:
                target = landing.next_target()
                try:
                    placed = self._open(target, by_address)
                except (AuthenticationFailed, ResolutionError):
                    raise
                except ConnectionFailed as exc:
                    landing.failed(target, self.via or target, exc)
                else:
                    reported = pick_node(nodes, placed.node).address(protocol)
                    if landing.landed(target, placed.dialled, reported) is Decision.ACCEPT:
                        placed.attempts = len(landing.attempts)
                        return placed
                    kept.append(placed)
                step = landing.next_step()
                if isinstance(step, UseFallback):
                    for placed in kept:
                        if pick_node(nodes, placed.node).address(protocol) == step.node:
                            kept.remove(placed)
                            return placed
                    landing.forget_fallback()
                    step = landing.next_step()
                if isinstance(step, GiveUp):
                    raise step.error
                if isinstance(step, Wait) and step.seconds:
                    time.sleep(step.seconds)
        finally:
            for placed in kept:
                placed.close()

    def _open(self, target: Address, by_address: dict[Address, BrokerNode]) -> PlacedConnection:
        if self.via is not None:
            dialled = self.via
        else:
            dialled = _run(self._resolve(target)) if not _in_loop() else _resolve_in_thread(self, target)
        if self.allow is not None:
            self.allow.check(dialled, why=f"AMQP connection for {target}")
        name = f"{self.connection_name}-amqp-{uuid.uuid4().hex[:8]}-{next(_ids)}"
        connection = self._dial(dialled, name)
        if self.via is None:
            node = by_address[target].name
        else:
            try:
                node = self.node_of(name)
            except BaseException:
                _close_quietly(connection)
                raise
        return PlacedConnection(connection, node, dialled, name)

    def _dial(self, dialled: Address, name: str) -> pika.BlockingConnection:
        import pika
        import pika.exceptions as px

        params = pika.ConnectionParameters(
            host=dialled.host, port=dialled.port, virtual_host=self.vhost,
            credentials=pika.PlainCredentials(self.credentials.username, self.credentials.password),
            heartbeat=self.heartbeat, client_properties={"connection_name": name},
            ssl_options=pika.SSLOptions(self.tls, dialled.host) if self.tls is not None else None,
            connection_attempts=1, socket_timeout=5, blocked_connection_timeout=30,
        )
        self.opened += 1
        try:
            return pika.BlockingConnection(params)
        except px.ProbableAuthenticationError as exc:
            raise AuthenticationFailed(f"connecting to {dialled}: the broker refused the credentials") from exc
        except px.ProbableAccessDeniedError as exc:
            raise AuthenticationFailed(f"connecting to {dialled}: no access to vhost {self.vhost!r}") from exc
        except (px.AMQPError, OSError) as exc:
            raise ConnectionFailed(f"connecting to {dialled}: {type(exc).__name__}: {exc}") from exc


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _resolve_in_thread(placer: AmqpPlacer, target: Address) -> Address:
    """Called from inside an event loop (a sync facade, a notebook): resolve on a worker thread."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_run, placer._resolve(target)).result()


T = TypeVar("T")


def _run(awaitable: Awaitable[T]) -> T:
    async def wrapper() -> T:
        return await awaitable

    return asyncio.run(wrapper())


def _close_quietly(connection: Any) -> None:
    try:
        connection.close()
    except Exception as exc:
        log.debug("closing an unidentified connection: %s", exc)

