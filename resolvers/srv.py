"""``SrvDiscovery``: entry points from a DNS SRV record (``_rabbitmq-stream._tcp.example.com``)."""

from __future__ import annotations

from collections.abc import Sequence

from smartclient._errors import ResolutionError
from smartclient.core.address import Address
from smartclient.core.validation import text

from ._dnspython import dns_resolver_for, dnspython_errors, servers_asked

__all__ = ["SrvDiscovery"]


class SrvDiscovery:
    """Look up an SRV name and return its targets as entry points, by priority then weight.

    The targets are names: the Environment dials them through its resolver like any other address
    (pair it with :class:`DnsResolver` on the same name servers when the system cannot resolve them).

    :raises ConfigurationError: a name server that is not an IP address (the message names it), a bad port
        or a timeout that is not positive.
    """

    def __init__(self, name: str, nameservers: Sequence[str] | None = None, port: int = 53,
                 timeout: float = 2.0) -> None:
        text("SrvDiscovery.name", name, note="an SRV name, such as _streams._tcp.example.com")
        self._resolver = dns_resolver_for(nameservers, port, timeout)
        self.name = name
        self.nameservers = tuple(nameservers) if nameservers is not None else None
        self.port = port

    async def discover(self) -> list[Address]:
        """The SRV targets, by priority then weight.

        :raises ResolutionTimeout: no name server answered within the timeout.
        :raises ResolutionError: the name does not exist, has no SRV record, or is malformed.
        """
        where = servers_asked(self.nameservers, self.port)
        with dnspython_errors(f"SRV name {self.name}", where):
            answer = await self._resolver.resolve(self.name, "SRV", raise_on_no_answer=False)
        if not answer.rrset:
            raise ResolutionError(f"no SRV records for {self.name} ({where})")
        records = sorted(answer.rrset, key=lambda r: (r.priority, -r.weight))
        return [Address(str(r.target).rstrip("."), int(r.port)) for r in records]

    def __repr__(self) -> str:
        return f"SrvDiscovery({self.name!r})"
