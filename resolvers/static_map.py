"""``StaticMap``: advertised ``host[:port]`` -> dialable ``host[:port]`` (containers, NAT)."""

from __future__ import annotations

from collections.abc import Mapping

from smartclient._errors import ConfigurationError, ResolutionError
from smartclient.core.address import Address
from smartclient.core.validation import flag, refuse

from .base import Resolver

__all__ = ["StaticMap"]


class StaticMap(Resolver):
    """Remap advertised addresses from a fixed table; unmapped addresses pass through (or fail, if strict).

    Keys are ``host:port`` (that exact listener) or ``host`` (every port of that host); values are
    ``host:port`` or ``host`` (keep the advertised port)::

        StaticMap({"rabbit-1:5552": "10.0.0.5:30001", "rabbit-2": "10.0.0.6"})
    """

    blocking = False

    def __init__(self, mapping: Mapping[str, str], strict: bool = False) -> None:
        if not isinstance(mapping, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in mapping.items()):
            refuse("mapping", "a mapping of 'host[:port]' to 'host[:port]' strs", mapping)
        flag("strict", strict)
        self._exact: dict[Address, tuple[str, int | None]] = {}
        self._hosts: dict[str, tuple[str, int | None]] = {}
        self.strict = strict
        for key, value in mapping.items():
            target = self._target(value)
            if _has_port(key):
                self._exact[Address.parse(key)] = target
            elif key:
                self._hosts[key.lower()] = target
            else:
                raise ConfigurationError("StaticMap has an empty key")

    @staticmethod
    def _target(value: str) -> tuple[str, int | None]:
        if _has_port(value):
            address = Address.parse(value)
            return address.host, address.port
        if not value:
            raise ConfigurationError("StaticMap maps to an empty host")
        return value, None

    def resolve(self, address: Address) -> Address:
        target = self._exact.get(address) or self._hosts.get(address.host.lower())
        if target is None:
            if self.strict:
                raise ResolutionError(f"StaticMap has no entry for {address} (strict)")
            return address
        host, port = target
        return Address(host, port if port is not None else address.port)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, StaticMap) and other.strict == self.strict and other._exact == self._exact
                and other._hosts == self._hosts)

    def __hash__(self) -> int:
        return hash((StaticMap, self.strict, frozenset(self._exact.items()), frozenset(self._hosts.items())))

    def __repr__(self) -> str:
        return f"StaticMap({len(self._exact) + len(self._hosts)} entries, strict={self.strict})"


def _has_port(text: str) -> bool:
    return (text.startswith("[") and "]:" in text) or text.count(":") == 1
