"""``AllowList``: the hosts and networks a connection may be dialled to, checked after resolution."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from smartclient._errors import AddressNotAllowed, ConfigurationError
from smartclient.core.address import Address
from smartclient.core.validation import texts

__all__ = ["AllowList"]


class AllowList:
    """Hosts (``rabbit-1.internal``), wildcards (``*.internal``) and networks (``10.0.0.0/8``, ``::1``).

    The Environment checks every address it is about to dial, after the resolver, so a metadata answer
    (or a resolver) that points outside the list is refused with :class:`AddressNotAllowed`.  Networks
    match IP literals only: resolve names to IPs first (``DnsResolver``) or list the names too.
    """

    def __init__(self, entries: Iterable[str]) -> None:
        self.hosts: set[str] = set()
        self.suffixes: list[str] = []
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        if isinstance(entries, Iterable) and not isinstance(entries, str | bytes | Mapping):
            entries = list(entries)
        texts("AllowList.entries", entries, empty=True, note="hosts, *.suffixes and networks")
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                raise ConfigurationError("AllowList has an empty entry")
            if entry.startswith("*."):
                self.suffixes.append(entry[1:])
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                if "/" in entry:
                    raise ConfigurationError(f"AllowList entry {raw!r} is not a valid network") from None
                self.hosts.add(entry.rstrip("."))
        if not (self.hosts or self.suffixes or self.networks):
            raise ConfigurationError("AllowList is empty: it would refuse every address")

    def allows(self, address: Address) -> bool:
        host = address.host.lower().rstrip(".")
        if host in self.hosts or any(host.endswith(s) for s in self.suffixes):
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(ip in net for net in self.networks)

    def check(self, address: Address, why: str = "") -> Address:
        if not self.allows(address):
            raise AddressNotAllowed(f"{address}{' (' + why + ')' if why else ''} is outside the allow-list {self}")
        return address

    def __str__(self) -> str:
        return "[" + ", ".join([*sorted(self.hosts), *("*" + s for s in self.suffixes), *map(str, self.networks)]) + "]"

    def __repr__(self) -> str:
        return f"AllowList({self})"
