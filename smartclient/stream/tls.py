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

import asyncio
import ipaddress
from typing import Any

from rstream import schema
from rstream.client import Client
from rstream.connection import Connection

from smartclient.core.address import Address
from smartclient.core.deadline import remaining

__all__ = ["NamedClient", "tls_server_name"]


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
    named = getattr(resolver, "tls_name", None)
    if callable(named):
        name = named(target)
        if name:
            return str(name)
    if not _is_ip(dialled.host):
        return dialled.host
    if not _is_ip(target.host):
        return target.host
    return dialled.host


class _NamedConnection(Connection):
    def __init__(self, host: str, port: int, ssl_context: Any, server_hostname: str | None) -> None:
        super().__init__(host, port, ssl_context)
        self.server_hostname = server_hostname

    async def open(self) -> None:
        kwargs: dict[str, Any] = {}
        if self._ssl_context is not None and self.server_hostname:
            kwargs["server_hostname"] = self.server_hostname
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(host=self.host, port=self.port, ssl=self._ssl_context, **kwargs),
                timeout=remaining(),  # the attempt's time left, not a fixed timeout of its own
            )
        except asyncio.TimeoutError:
            raise ConnectionError(f"Could not connect to {self.host}:{self.port}") from None


class NamedClient(Client):
    """rstream's Client, opening its socket with ``server_hostname`` (set before :meth:`start`)."""

    server_hostname: str | None = None

    async def start(self) -> None:
        # rstream's Client.start, with our connection class (tests/unit/test_rstream_seam.py pins it)
        assert self._conn is None
        self._conn = _NamedConnection(self.host, self.port, self._ssl_context, self.server_hostname)
        await self._conn.open()
        self.start_task("listener", self._listener())
        self.add_handler(schema.Heartbeat, self._on_heartbeat)
        self.add_handler(schema.Close, self._on_close)
