"""``Address``: a host and a port, the one value every resolver takes and returns."""

from __future__ import annotations

from dataclasses import dataclass

from smartclient._errors import ConfigurationError
from smartclient.core.validation import text, whole

__all__ = ["Address"]


@dataclass(frozen=True, order=True)
class Address:
    """A ``host:port`` pair.  ``str(address)`` brackets IPv6 hosts: ``[::1]:5552``."""

    host: str
    port: int

    def __post_init__(self) -> None:
        text("Address.host", self.host)
        whole(f"the port of {self.host}", self.port, low=1, high=65535)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, default_port: int | None = None) -> Address:
        """Parse ``host:port``, ``[v6]:port`` or, with ``default_port``, a bare host."""
        value = text.strip()
        if not value:
            raise ConfigurationError("empty address")
        host, port_text = value, ""
        if value.startswith("["):
            end = value.find("]")
            if end < 0:
                raise ConfigurationError(f"address {text!r} opens '[' without closing it")
            host, rest = value[1:end], value[end + 1 :]
            if rest and not rest.startswith(":"):
                raise ConfigurationError(f"address {text!r} has text after ']' that is not ':port'")
            port_text = rest[1:]
        elif value.count(":") == 1:
            host, port_text = value.split(":")
        if not port_text:
            if default_port is None:
                raise ConfigurationError(f"address {text!r} has no port")
            return cls(host, default_port)
        if not port_text.isdigit():
            raise ConfigurationError(f"port {port_text!r} in address {text!r} is not a number")
        return cls(host, int(port_text))
