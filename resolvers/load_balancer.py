"""``LoadBalancer``: always dial the load balancer; the connector then checks which node it reached."""

from __future__ import annotations

from smartclient.core.address import Address

__all__ = ["LoadBalancer"]


class LoadBalancer:
    """Map every address to the LB's.  Placement still holds: each connection's reported node is checked
    against the candidates, wrong landings are kept for other placements, and attempts are capped."""

    blocking = False

    def __init__(self, address: str | Address) -> None:
        self.address = address if isinstance(address, Address) else Address.parse(address)

    def resolve(self, address: Address) -> Address:
        return self.address

    def tls_name(self, address: Address) -> str:
        """Through a load balancer, TLS verifies the LB's name (whatever node answers)."""
        return self.address.host

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoadBalancer) and other.address == self.address

    def __hash__(self) -> int:
        return hash((LoadBalancer, self.address))

    def __repr__(self) -> str:
        return f"LoadBalancer({str(self.address)!r})"
