"""TLS that verifies the name the user meant, not the address that was dialled.

Behind a remap (a container name resolved to an IP) or a load balancer, the address dialled is not
the name on the certificate.  rstream opens its sockets with ``server_hostname`` = the dialled host,
so smartclient gives its connections a ``server_hostname`` of their own (SNI and hostname check):

1. an explicit ``tls_server_name`` given to the Environment, else
2. the load balancer's own name, for a ``LoadBalancer`` resolver (also inside a ``Chain``), else
3. the dialled host, if it is a name, else
4. the advertised node name, if the resolver remapped a name to an IP, else
5. the IP itself.

Verification is never turned off: a certificate that does not match fails the connection.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Protocol, runtime_checkable

from smartclient.core.address import Address

__all__ = ["NamesTls", "tls_server_name"]


@runtime_checkable
class NamesTls(Protocol):
    """The optional second method of the resolver contract (see :mod:`resolvers.base`): the name TLS must
    verify for connections aimed at ``address``, or None to let the rule below decide."""

    def tls_name(self, address: Address) -> str | None: ...


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def tls_server_name(target: Address, dialled: Address, resolver: Any, override: str | None = None) -> str:
    """The name a TLS connection aimed at ``target`` and dialled at ``dialled`` must verify."""
    if override:
        return override
    if isinstance(resolver, NamesTls):
        name = resolver.tls_name(target)
        if name:
            return str(name)
    if not _is_ip(dialled.host):
        return dialled.host
    if not _is_ip(target.host):
        return target.host
    return dialled.host
