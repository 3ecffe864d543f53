"""Address resolvers for smartclient: one method, ``resolve(address) -> address``.

A resolver maps the address a node *advertises* (from the stream metadata) to
the address the client should *dial*.  Any object with ``resolve`` or any
callable works, sync or async; a :class:`Resolver` subclass may declare more
(listeners per protocol, a TLS name, an SNI rule: see ``resolvers.base``).
The built-ins are:

* :class:`Identity` (the default) dials what is advertised;
* :class:`StaticMap` remaps advertised ``host[:port]`` from a table (containers, NAT);
* :class:`DnsResolver` resolves names through chosen name servers, caching by TTL;
* :class:`LoadBalancer` always dials the LB (the node is then checked, not assumed);
* :class:`SniRouter` dials a TLS ingress that routes by SNI, sending the target node's name (checked too);
* :class:`Chain` applies several in order.

:class:`SrvDiscovery` finds entry points, and :class:`AllowList` bounds where
any of them may send a connection.  The check of the node a connection
reaches is not a resolver's job: the Environment does it, in one place.
"""

from __future__ import annotations

from .allow_list import AllowList
from .base import Resolver, ResolverLike, Resolves, as_async, as_resolver
from .chain import Chain
from .dns_resolver import DnsResolver
from .identity import Identity
from .load_balancer import LoadBalancer
from .sni import SniRouter
from .srv import SrvDiscovery
from .static_map import StaticMap

__all__ = [
    "AllowList",
    "Chain",
    "DnsResolver",
    "Identity",
    "LoadBalancer",
    "Resolver",
    "ResolverLike",
    "Resolves",
    "SniRouter",
    "SrvDiscovery",
    "StaticMap",
    "as_async",
    "as_resolver",
]
