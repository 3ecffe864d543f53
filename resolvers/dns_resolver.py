"""``DnsResolver``: resolve advertised names through chosen name servers (dnspython), caching by TTL."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Sequence
from typing import Any

from smartclient._errors import ConfigurationError, ResolutionError, ResolutionTimeout
from smartclient.address import Address

__all__ = ["DnsResolver", "dns_resolver_for"]


def dns_resolver_for(nameservers: Sequence[str] | None, port: int, timeout: float) -> Any:
    """A ``dns.asyncresolver.Resolver`` for these name servers (the system's when None)."""
    try:
        import dns.asyncresolver
    except ImportError as exc:  # pragma: no cover - depends on the extras installed
        raise ConfigurationError("DNS resolution needs dnspython: pip install 'smartclient[dns]'") from exc
    if timeout <= 0:
        raise ConfigurationError(f"DNS timeout must be positive, not {timeout}")
    resolver = dns.asyncresolver.Resolver(configure=nameservers is None)
    if nameservers is not None:
        if not nameservers:
            raise ConfigurationError("DnsResolver needs at least one name server")
        resolver.nameservers = list(nameservers)
        resolver.port = port
    resolver.lifetime = timeout
    resolver.timeout = timeout
    return resolver


class DnsResolver:
    """Resolve the host of an advertised address to an IP (A, then AAAA) through the given name servers.

    Answers are cached for their TTL, so a name server that goes away is not noticed until the cached
    answer expires; then :class:`ResolutionTimeout` (no answer) or :class:`ResolutionError` (NXDOMAIN,
    no address) names the host.  IP literals pass through untouched, and ``localhost`` names are loopback
    without a query (RFC 6761).

    :param nameservers: IPs of the name servers; None uses the system's.
    :param port: their port (the test bed's runs on a high loopback port).
    :param timeout: seconds for one lookup, all retries included.
    """

    def __init__(self, nameservers: Sequence[str] | None = None, port: int = 53, timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nameservers = tuple(nameservers) if nameservers is not None else None
        self.port = port
        self._resolver = dns_resolver_for(nameservers, port, timeout)
        self._cache: dict[str, tuple[str, float]] = {}
        self._clock = clock

    async def resolve(self, address: Address) -> Address:
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
            return Address(cached[0], address.port)
        ip, ttl = await self._lookup(host)
        self._cache[host.lower()] = (ip, self._clock() + ttl)
        return Address(ip, address.port)

    async def _lookup(self, host: str) -> tuple[str, int]:
        import dns.exception
        import dns.resolver

        where = f"name servers {', '.join(self.nameservers)} port {self.port}" if self.nameservers else "system DNS"
        last: Exception | None = None
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(host, rdtype)
            except dns.resolver.NXDOMAIN:
                raise ResolutionError(f"{host} does not exist (NXDOMAIN from {where})") from None
            except dns.resolver.NoAnswer as exc:
                last = exc
                continue
            except dns.exception.Timeout:
                raise ResolutionTimeout(f"no answer for {host} from {where} within the timeout") from None
            except dns.resolver.NoNameservers as exc:
                raise ResolutionError(f"no name server answered for {host} ({where}): {exc}") from None
            rrset = answer.rrset
            return str(rrset[0].address), int(rrset.ttl)
        raise ResolutionError(f"{host} has no A or AAAA record ({where}): {last}")

    def __repr__(self) -> str:
        servers = ",".join(self.nameservers) if self.nameservers else "system"
        return f"DnsResolver({servers}:{self.port})"
