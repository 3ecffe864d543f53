"""The one resolution seam: a target node becomes what to dial and which name TLS verifies.

Every protocol asks here, once per connection: the stream connector, and the node placer of AMQP and MQTT.
redis-py's ``remap_host_port`` is the model: the resolver runs in exactly one place.

* **What to dial:** the resolver's answer for the target (``resolve(address) -> address``), or the load
  balancer's (or SNI ingress's) listener for the protocol when connections go through one; then the allow-list.
* **Which name TLS verifies** (:mod:`smartclient.core.tls_names`): through an SNI ingress (a resolver that
  :class:`~smartclient.core.tls_names.RoutesByName`), the target node's name, which also routes the connection;
  else an explicit override; else the name the resolver gives (``tls_name(address)``, part of the resolver
  contract in :mod:`resolvers.base`; a load balancer names itself); else the dialled host if it is a name; else
  the target's name behind a remap.
* **Routed by name:** what a connection's landing is checked against (:meth:`Resolution.routed`): through an
  SNI ingress, the node it named and nothing else (a connection reporting another one is misrouted).

The node's name reaches the SNI rule as an argument (``route(target, node=...)``) or, for the AMQP and MQTT
placers, through :attr:`Resolution.node_named` (the name of the node whose listener a target is).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from smartclient._errors import CertificateRejected, ConfigurationError, ConnectionFailed
from smartclient.core.address import Address
from smartclient.core.landing import Routed
from smartclient.core.tls_names import tls_server_name

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike
    from resolvers.base import Resolver

__all__ = ["Resolution", "Route", "run_sync", "through"]

T = TypeVar("T")


def through(resolver: ResolverLike, protocol: str) -> Address | None:
    """Where ``protocol`` connections go through: the listener for it of a resolver that sends every connection
    to one place (a load balancer, an SNI ingress), or None (each connection goes where the resolver says).

    :raises ConfigurationError: the resolver has no listener for ``protocol``."""
    from resolvers.base import as_resolver

    contract = as_resolver(resolver)
    if not contract.listens():
        return None
    listener = contract.address_for(protocol)
    if listener is None:
        raise ConfigurationError(
            f"the resolver sends every address to {resolver!r}, which has no {protocol} listener: "
            f"{type(resolver).__name__}(..., {contract.option_for(protocol)}=PORT)")
    return listener


@dataclass(frozen=True)
class Route:
    """Where a connection aimed at ``target`` goes: the address to dial, and the name TLS verifies (None
    without TLS)."""

    target: Address
    dial: Address
    tls_name: str | None


class Resolution:
    """One resolver, allow-list and TLS rule, applied the same way for every connection of one client.

    :param protocol: the protocol of the connections (``amqp``, ``mqtt``, ``mqtt/ssl``; None for streams): when the
        resolver is a load balancer with a listener for it, every connection dials that listener (:attr:`lb`),
        whatever the target, and the placement loop checks the node each one reached.  Through an SNI ingress
        every connection dials its listener too (:attr:`listener`), but lands where its name says
        (:attr:`by_name`): checked, never retried until it lands.
    :raises ConfigurationError: the resolver is a load balancer without a listener for ``protocol``; it routes by
        name (SNI) without TLS, or with a ``tls_server_name`` that would send every connection to one node.
    """

    def __init__(self, resolver: ResolverLike | None, allow: AllowList | None = None, *, tls: bool = False,
                 tls_override: str | None = None, protocol: str | None = None) -> None:
        from resolvers import Identity
        from resolvers.base import as_async, as_resolver

        self.resolver = resolver if resolver is not None else Identity()  #: as it was given
        #: the same, as the whole contract (its every optional member declared: resolvers.base)
        self.contract: Resolver = as_resolver(self.resolver)
        self._resolve = as_async(self.contract)
        self.allow = allow
        self.tls = tls
        self.tls_override = tls_override
        #: the protocol an SNI rule is told: ``stream``, ``amqp`` or ``mqtt`` (over TLS or not)
        self.family = (protocol or "stream").split("/", 1)[0]
        #: the resolver, when it routes each connection by the name it sends (SNI); None otherwise
        self.by_name: Resolver | None = self.contract if self.contract.routes_by_name() else None
        if self.by_name is not None and not tls:
            raise ConfigurationError(f"{self.resolver!r} routes each connection by the name in its TLS hello (SNI): "
                                     f"give tls= (an ssl.SSLContext) as well")
        if self.by_name is not None and tls_override:
            raise ConfigurationError(
                f"tls_server_name={tls_override!r} would send one SNI name for every node, and {self.resolver!r} "
                f"routes each connection by its node's name: leave tls_server_name out")
        #: the listener every connection of ``protocol`` dials, whatever its target (a load balancer's, an ingress's)
        self.listener = through(self.resolver, protocol) if protocol is not None else None
        #: the load balancer's listener, when a connection lands wherever the balancer sends it (then it is checked,
        #: and kept or retried); None directly and through an SNI ingress (each connection lands on the node it names)
        self.lb = None if self.by_name is not None else self.listener
        #: the name of the node whose listener a target is, where the caller knows it (the AMQP and MQTT placers):
        #: what an SNI rule is given for that target when no ``node`` is passed
        self.node_named: Callable[[Address], str | None] | None = None
        self.on_resolved: Callable[[float], None] | None = None  # told each resolver call's time (metrics)

    async def dial_address(self, target: Address) -> Address:
        """What to dial for ``target`` (the load balancer's or ingress's listener, or the resolver; then the
        allow-list)."""
        if self.listener is not None:
            dialled = self.listener
        elif self.on_resolved is None:
            dialled = await self._resolve(target)
        else:
            began = time.monotonic()
            dialled = await self._resolve(target)
            self.on_resolved(time.monotonic() - began)
        if self.allow is not None:
            self.allow.check(dialled, why=f"resolved from {target}")
        return dialled

    @property
    def reaches_target(self) -> bool:
        """Whether a connection reaches the very node it aimed at, and TLS names it by the target alone: no load
        balancer or ingress in between, no name given instead."""
        return self.lb is None and self.by_name is None and not self.tls_override

    def tls_name(self, target: Address, dialled: Address, node: str | None = None) -> str | None:
        """The name TLS verifies for a connection aimed at ``target`` and dialled at ``dialled`` (None
        without TLS); ``node``: the target node's name, for a resolver that routes by it (else
        :attr:`node_named` is asked, else the target's host stands for the node).

        :raises ResolutionError: the resolver's SNI rule gave no usable name."""
        if not self.tls:
            return None
        if node is None and self.by_name is not None and self.node_named is not None:
            node = self.node_named(target)
        return tls_server_name(target, dialled, self.contract, self.tls_override, node, self.family)

    def routed(self, target: Address, node: str | None = None, reached: str | None = None) -> Routed | None:
        """How a connection aimed at ``target`` (the node called ``node``, if known) is routed: by the SNI name
        it sends, when the resolver routes by name (then it must reach ``target`` and nothing else); None
        otherwise.  ``reached``: the name of the node it reached, for the messages."""
        if self.by_name is None:
            return None
        node = node or (self.node_named(target) if self.node_named is not None else None)
        return Routed(str(self.tls_name(target, target, node)), node, reached)

    @contextlib.contextmanager
    def routing_errors(self, target: Address, node: str | None = None) -> Iterator[None]:
        """Around the dial of a connection aimed at ``target``: through an SNI ingress, a failure says which name
        was sent.  A certificate that does not verify for it says the ingress may have misrouted it (each node's
        certificate naming only itself, a misroute fails here, before the node check; still never retried); a
        connection that failed (a route down: refused, reset, the handshake cut) says the ingress may have no
        route to the node (and the next candidate is tried, as for any node that is down).

        :raises CertificateRejected: the certificate did not verify.  :raises ConnectionFailed: the dial failed."""
        try:
            yield
        except CertificateRejected as exc:
            routed = self.routed(target, node)
            if routed is None:
                raise
            raise CertificateRejected(
                f"{exc}: the certificate does not name {routed.sni!r}, the SNI name sent for node "
                f"{routed.wanted or target} through {self.resolver!r}; the ingress may have misrouted it to another "
                f"node (whose certificate names only itself), or that node's certificate lacks the name") from exc
        except ConnectionFailed as exc:
            routed = self.routed(target, node)
            if routed is None or type(exc) is not ConnectionFailed:
                raise
            raise ConnectionFailed(f"{exc} (sent the SNI name {routed.sni!r} for node {routed.wanted or target}: "
                                   f"the ingress may have no route to it)") from exc

    async def route(self, target: Address, node: str | None = None) -> Route:
        """Where a connection aimed at ``target`` (the node called ``node``, if the caller knows it) goes.

        :raises ResolutionError: the resolver failed.  :raises AddressNotAllowed: outside the allow-list.
        """
        dialled = await self.dial_address(target)
        return Route(target, dialled, self.tls_name(target, dialled, node))

    def route_sync(self, target: Address, node: str | None = None) -> Route:
        """:meth:`route` from blocking code (pika, paho): run to completion, on a worker thread if an event
        loop is running in this thread."""
        return run_sync(self.route(target, node))


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion from sync code (on a worker thread if this thread runs a loop)."""

    async def wrapper() -> T:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrapper())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wrapper()).result()
