"""``SrvDiscovery``: entry points from a DNS SRV record (``_rabbitmq-stream._tcp.example.com``)."""

from __future__ import annotations

from collections.abc import Sequence

from smartclient._errors import ResolutionError, ResolutionTimeout
from smartclient.address import Address

from .dns_resolver import dns_resolver_for

__all__ = ["SrvDiscovery"]


class SrvDiscovery:
    """Look up an SRV name and return its targets as entry points, by priority then weight.

    The targets are names: the Environment dials them through its resolver like any other address
    (pair it with :class:`DnsResolver` on the same name servers when the system cannot resolve them).
    """

    def __init__(self, name: str, nameservers: Sequence[str] | None = None, port: int = 53,
                 timeout: float = 2.0) -> None:
        self.name = name
        self.nameservers = tuple(nameservers) if nameservers is not None else None
        self.port = port
        self._resolver = dns_resolver_for(nameservers, port, timeout)

    async def discover(self) -> list[Address]:
        import dns.exception
        import dns.resolver

        try:
            answer = await self._resolver.resolve(self.name, "SRV")
        except dns.resolver.NXDOMAIN:
            raise ResolutionError(f"SRV name {self.name} does not exist (NXDOMAIN)") from None
        except dns.exception.Timeout:
            raise ResolutionTimeout(f"no answer for SRV {self.name} within the timeout") from None
        except (dns.resolver.NoAnswer, dns.resolver.NoNameservers) as exc:
            raise ResolutionError(f"no SRV records for {self.name}: {exc}") from None
        records = sorted(answer, key=lambda r: (r.priority, -r.weight))
        return [Address(str(r.target).rstrip("."), int(r.port)) for r in records]

    def __repr__(self) -> str:
        return f"SrvDiscovery({self.name!r})"
