"""The one resolution seam: a target node becomes what to dial and which name TLS verifies.

Every protocol asks here, once per connection: the stream connector, and the node placer of AMQP and MQTT.
redis-py's ``remap_host_port`` is the model: the resolver runs in exactly one place.

* **What to dial:** the resolver's answer for the target (``resolve(address) -> address``), or the load
  balancer's address for the protocol when connections go through one; then the allow-list.
* **Which name TLS verifies** (:mod:`smartclient.core.tls_names`): an explicit override; else the name the
  resolver gives (``tls_name(address)``, part of the resolver contract in :mod:`resolvers.base`; a load
  balancer names itself); else the dialled host if it is a name; else the target's name behind a remap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from smartclient._errors import ConfigurationError
from smartclient.core.address import Address
from smartclient.core.tls_names import tls_server_name

if TYPE_CHECKING:
    from resolvers import AllowList, ResolverLike

__all__ = ["Resolution", "Route", "run_sync", "through"]

T = TypeVar("T")


def through(resolver: ResolverLike, protocol: str) -> Address | None:
    """Where ``protocol`` connections go through: the load balancer resolver's listener for it, or None (each
    connection goes where the resolver says).

    :raises ConfigurationError: the resolver is a load balancer without a listener for ``protocol``."""
    from resolvers.base import ListensPerProtocol

    option = protocol.replace("/ssl", "_tls")
    if isinstance(resolver, ListensPerProtocol):
        listener = resolver.address_for(protocol)
        if listener is None:
            raise ConfigurationError(
                f"the resolver sends every address to the load balancer {resolver!r}, which has no "
                f"{protocol} listener: LoadBalancer(..., {option}=PORT)")
        return listener
    return None


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
        whatever the target, and the placement loop checks the node each one reached.
    :raises ConfigurationError: the resolver is a load balancer without a listener for ``protocol``.
    """

    def __init__(self, resolver: ResolverLike | None, allow: AllowList | None = None, *, tls: bool = False,
                 tls_override: str | None = None, protocol: str | None = None) -> None:
        from resolvers import Identity
        from resolvers.base import as_async

        self.resolver = resolver if resolver is not None else Identity()
        self._resolve = as_async(self.resolver)
        self.allow = allow
        self.tls = tls
        self.tls_override = tls_override
        self.lb = through(self.resolver, protocol) if protocol is not None else None
        self.on_resolved: Callable[[float], None] | None = None  # told each resolver call's time (metrics)

    async def dial_address(self, target: Address) -> Address:
        """What to dial for ``target`` (the load balancer's listener, or the resolver; then the allow-list)."""
        if self.lb is not None:
            dialled = self.lb
        elif self.on_resolved is None:
            dialled = await self._resolve(target)
        else:
            began = time.monotonic()
            dialled = await self._resolve(target)
            self.on_resolved(time.monotonic() - began)
        if self.allow is not None:
            self.allow.check(dialled, why=f"resolved from {target}")
        return dialled

    def tls_name(self, target: Address, dialled: Address) -> str | None:
        """The name TLS verifies for a connection aimed at ``target`` and dialled at ``dialled`` (None
        without TLS)."""
        return tls_server_name(target, dialled, self.resolver, self.tls_override) if self.tls else None

    async def route(self, target: Address) -> Route:
        """Where a connection aimed at ``target`` goes.

        :raises ResolutionError: the resolver failed.  :raises AddressNotAllowed: outside the allow-list.
        """
        dialled = await self.dial_address(target)
        return Route(target, dialled, self.tls_name(target, dialled))

    def route_sync(self, target: Address) -> Route:
        """:meth:`route` from blocking code (pika, paho): run to completion, on a worker thread if an event
        loop is running in this thread."""
        return run_sync(self.route(target))


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
