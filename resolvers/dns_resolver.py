"""``DnsResolver``: resolve advertised names through chosen name servers (dnspython), caching by TTL."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Sequence

from smartclient._errors import ResolutionError
from smartclient.core.address import Address
from smartclient.core.validation import function

from ._dnspython import dns_resolver_for, dnspython_errors, servers_asked
from .base import Resolver

__all__ = ["DnsResolver", "dns_resolver_for"]


class DnsResolver(Resolver):
    """Resolve the host of an advertised address to an IP (A, then AAAA) through the given name servers.

    Answers are cached for their TTL, so a name server that goes away is not noticed until the cached
    answer expires; then :class:`ResolutionTimeout` (no answer) or :class:`ResolutionError` (NXDOMAIN,
    no address) names the host.  IP literals pass through untouched, and ``localhost`` names are loopback
    without a query (RFC 6761).

    :param nameservers: IPs of the name servers; None uses the system's.
    :param port: their port (the test bed's runs on a high loopback port).
    :param timeout: seconds for one lookup, all retries included.
    :raises ConfigurationError: a name server that is not an IP address (the message names it), no name
        server, a bad port or a timeout that is not positive; dnspython's own errors never escape
        (see ``resolvers._dnspython``).
    """

    def __init__(self, nameservers: Sequence[str] | None = None, port: int = 53, timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._resolver = dns_resolver_for(nameservers, port, timeout)
        function("clock", clock, optional=False, takes="() -> seconds")
        self.nameservers = tuple(nameservers) if nameservers is not None else None
        self.port = port
        self._cache: dict[str, tuple[str, float]] = {}
        self._clock = clock
        self.lookups = 0  # answers asked of a name server (metrics: smartclient.dns.lookups)
        self.cache_hits = 0  # answers taken from the cache

    async def resolve(self, address: Address) -> Address:
        """The address with its host resolved to an IP (the port is kept).

        :raises ResolutionTimeout: no name server answered within the timeout.
        :raises ResolutionError: NXDOMAIN, no A or AAAA record, a malformed name, or every name server failed.
        """
        host = address.host.rstrip(".")
        try:
            ipaddress.ip_address(host)
            return address
        except ValueError:
            pass
        if host.lower() == "localhost" or host.lower().endswith(".localhost"):
            return Address("127.0.0.1", address.port)  # RFC 6761 6.3: never sent to a name server
        cached = self._cache.get(host.lower())
        if cached and cached[1] > self._clock():
            self.cache_hits += 1
            return Address(cached[0], address.port)
        self.lookups += 1
        ip, ttl = await self._lookup(host)
        self._cache[host.lower()] = (ip, self._clock() + ttl)
        return Address(ip, address.port)

    async def _lookup(self, host: str) -> tuple[str, int]:
        where = servers_asked(self.nameservers, self.port)
        with dnspython_errors(host, where):
            for rdtype in ("A", "AAAA"):
                answer = await self._resolver.resolve(host, rdtype, raise_on_no_answer=False)
                if answer.rrset:
                    return str(answer.rrset[0].address), int(answer.rrset.ttl)
        raise ResolutionError(f"{host} has no A or AAAA record ({where})")

    def cache_counts(self) -> tuple[int, int]:
        return self.lookups, self.cache_hits

    def __repr__(self) -> str:
        servers = ",".join(self.nameservers) if self.nameservers else "system"
        return f"DnsResolver({servers}:{self.port})"
