"""``Identity``: dial the advertised address as it is (the default)."""

from __future__ import annotations

from smartclient.core.address import Address

from .base import Resolver

__all__ = ["Identity"]


class Identity(Resolver):
    """Return the address unchanged: right when the nodes advertise names the client can resolve."""

    blocking = False

    def resolve(self, address: Address) -> Address:
        return address

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity)

    def __hash__(self) -> int:
        return hash(Identity)

    def __repr__(self) -> str:
        return "Identity()"
