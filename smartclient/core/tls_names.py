"""TLS that verifies the name the user meant, not the address that was dialled.

Behind a remap (a container name resolved to an IP) or a load balancer, the address dialled is not
the name on the certificate.  rstream opens its sockets with ``server_hostname`` = the dialled host,
so smartclient gives its connections a ``server_hostname`` of their own (SNI and hostname check):

1. through an ingress that routes by that name (an ``SniRouter``, :class:`RoutesByName`): the name of the
   target *node*, which picks the node (SNI) and is the name its certificate must carry; else
2. an explicit ``tls_server_name`` given to the Environment, else
3. the load balancer's own name, for a ``LoadBalancer`` resolver (also inside a ``Chain``), else
4. the dialled host, if it is a name, else
5. the advertised node name, if the resolver remapped a name to an IP, else
6. the IP itself.

Verification is never turned off: a certificate that does not match fails the connection.

Which string stands for the node (what :meth:`RoutesByName.sni_name` is given): the node's Erlang name where
the protocol's placer knows it (AMQP and MQTT: ``rabbit@rabbit-server-0.rabbit-nodes.ns``, from the management
API), else the target's host (streams: the host the node advertises in the stream metadata,
``rabbit-server-0.rabbit-nodes.ns``; an entry point: its host).  It is given the protocol too (``stream``,
``amqp`` or ``mqtt``), for an ingress that serves every protocol on one port and routes each by a name of its
own.  :func:`default_sni_name` is the rule when none is given: the host part of an Erlang name, any other string
as it is.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Protocol

from smartclient._errors import ResolutionError
from smartclient.core.address import Address

__all__ = ["NamesNodes", "checked_sni_name", "default_sni_name", "dns_tls_name", "tls_server_name"]


class NamesNodes(Protocol):
    """What the TLS rule reads of a resolver (declared, with defaults, by :class:`resolvers.Resolver`): the name
    it gives connections aimed at ``address`` (``tls_name``, None: the rule below decides), and whether it routes
    each connection by the name in its TLS hello (SNI), and then the name that reaches ``node`` over ``protocol``
    (``stream``, ``amqp``, ``mqtt``; see the module docstring for the string ``node`` is).  That name is sent and
    verified, and each connection is checked to have reached the node it named (a connection that reports
    another node is :class:`Misrouted`)."""

    def tls_name(self, address: Address) -> str | None: ...

    def routes_by_name(self) -> bool: ...

    def sni_name(self, node: str, protocol: str) -> str: ...


def default_sni_name(node: str) -> str:
    """The SNI name of ``node`` when no rule is given: the host of an Erlang node name
    (``rabbit@rabbit-server-0.rabbit-nodes.ns`` -> ``rabbit-server-0.rabbit-nodes.ns``), any other string
    (an advertised host) as it is.  Right where the nodes are named after the host names the ingress routes."""
    return node.split("@", 1)[1] if "@" in node else node


def checked_sni_name(value: object, node: str, source: str) -> str:
    """``value``, the SNI name ``source`` gave for ``node``, if it can be one: a DNS name (TLS sends no IP
    address as SNI, so an ingress could not route by it).

    :raises ResolutionError: anything else, naming the node and the source."""
    problem = ""
    if not isinstance(value, str):
        problem = f"{type(value).__name__}, not a str"
    elif not value or len(value) > 253:
        problem = "no usable host name (empty, or over 253 characters)"
    elif _is_ip(value.strip("[]")):
        problem = "an IP address, which TLS does not send as SNI"
    elif not _NAME.fullmatch(value):
        problem = "not a DNS name (letters, digits, '-', '_' and dots)"
    if problem:
        raise ResolutionError(f"{source} named node {node!r} {value!r}: {problem}")
    return str(value)


_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def tls_server_name(target: Address, dialled: Address, resolver: NamesNodes, override: str | None = None,
                    node: str | None = None, protocol: str = "stream") -> str:
    """The name a TLS connection aimed at ``target`` and dialled at ``dialled`` must verify; ``node``: the
    target node's name, where the caller knows it (AMQP and MQTT placement), and ``protocol`` (``stream``,
    ``amqp``, ``mqtt``), for a resolver that routes by name.

    :raises ResolutionError: a resolver that routes by name gave no usable name."""
    if resolver.routes_by_name():
        return resolver.sni_name(node or target.host, protocol)
    if override:
        return override
    name = resolver.tls_name(target)
    if name:
        return str(name)
    if not _is_ip(dialled.host):
        return dialled.host
    if not _is_ip(target.host):
        return target.host
    return dialled.host


def dns_tls_name(name: str, node: str | None) -> str:
    """The name a TLS client that verifies DNS names only (proton, under the AMQP 1.0 wing) verifies for a
    connection whose rule gave ``name``: ``name`` itself, or, when that is an IP address (a node listening on one,
    with the certificate's IP entry out of proton's reach), the host of the target node's Erlang name
    (``rabbit@rabbit-server-0.rabbit-nodes.ns`` -> ``rabbit-server-0.rabbit-nodes.ns``), which the nodes'
    certificates carry wherever the nodes are named after their hosts.  Verification stays on: a certificate
    without that name fails the connection.

    :raises ConfigurationError: an IP address and no node name to verify instead (the caller gives none where
        the connection may reach another node than its target: through a load balancer)."""
    if not _is_ip(name.strip("[]")):
        return name
    host = default_sni_name(node) if node else ""
    if host and not _is_ip(host.strip("[]")):
        return host
    from smartclient._errors import ConfigurationError

    raise ConfigurationError(f"TLS would verify the IP address {name}, and the AMQP 1.0 client (proton) verifies "
                             f"DNS names only: give tls_server_name= (a name on the nodes' certificates), or reach "
                             f"the nodes by name")
