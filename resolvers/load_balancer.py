"""``LoadBalancer``: always dial the load balancer; the connector then checks which node it reached."""

from __future__ import annotations

from smartclient.core.address import Address
from smartclient.core.validation import instance, whole

from .base import Resolver

__all__ = ["LoadBalancer", "listener"]


class LoadBalancer(Resolver):
    """Map every address to the LB's.  Placement still holds: each connection's reported node is checked
    against the candidates, wrong landings are kept for other placements, and attempts are capped.

    :param address: the LB's stream listener, ``host:port``.
    :param amqp: its AMQP 0.9.1 listener: a port on the same host, or ``host:port``.
    :param mqtt: its MQTT listener.
    :param mqtt_tls: its MQTT-over-TLS listener.
    :param amqp_tls: its AMQPS (AMQP 0.9.1 over TLS) listener: an Environment with TLS places AMQP connections
        on the nodes' ``amqp/ssl`` listeners, so through this one.

    One value names the LB for every protocol an Environment speaks:
    ``LoadBalancer("lb:5552", amqp=5672, mqtt=1883)`` sends AMQP and MQTT connections through it too.
    """

    blocking = False

    def __init__(self, address: str | Address, *, amqp: int | str | Address | None = None,
                 mqtt: int | str | Address | None = None, mqtt_tls: int | str | Address | None = None,
                 amqp_tls: int | str | Address | None = None) -> None:
        instance("address", address, (str, Address), optional=False, what="'host:port' or an Address")
        self.address = address if isinstance(address, Address) else Address.parse(address)
        self.listeners: dict[str, Address] = {"stream": self.address}
        for option, protocol, value in (("amqp", "amqp", amqp), ("mqtt", "mqtt", mqtt),
                                        ("mqtt_tls", "mqtt/ssl", mqtt_tls), ("amqp_tls", "amqp/ssl", amqp_tls)):
            if value is not None:
                self.listeners[protocol] = listener(self.address, f"the load balancer's {option} listener", value)

    def listens(self) -> bool:
        return True

    def address_for(self, protocol: str) -> Address | None:
        """The LB's listener for ``protocol`` (``stream``, ``amqp``, ``amqp/ssl``, ``mqtt``, ``mqtt/ssl``), if it has
        one."""
        return self.listeners.get(protocol)

    def resolve(self, address: Address) -> Address:
        return self.address

    def tls_name(self, address: Address) -> str:
        """Through a load balancer, TLS verifies the LB's name (whatever node answers)."""
        return self.address.host

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoadBalancer) and other.listeners == self.listeners

    def __hash__(self) -> int:
        return hash((LoadBalancer, tuple(sorted((k, str(v)) for k, v in self.listeners.items()))))

    def __repr__(self) -> str:
        extra = "".join(f", {k.replace('/ssl', '_tls')}={str(v)!r}" for k, v in self.listeners.items() if k != "stream")
        return f"LoadBalancer({str(self.address)!r}{extra})"


def listener(main: Address, what: str, value: int | str | Address) -> Address:
    """Another listener of the place at ``main``: a port on the same host, ``'host:port'`` or an Address.

    :raises ConfigurationError: anything else, naming ``what``."""
    if isinstance(value, Address):
        return value
    if isinstance(value, str):
        return Address.parse(value)
    whole(what, value, low=1, high=65535, note="a port on the same host; or 'host:port', or an Address")
    return Address(main.host, value)
