"""``SniRouter``: every connection through one TLS ingress that routes by SNI, to the node the name says.

An ingress with one TLS port per protocol that passes TLS through, picking the backend by the name in the
TLS hello (ingress-nginx or Traefik ``HostSNI`` passthrough, OpenShift passthrough routes, Envoy/Istio
``sni``, HAProxy ``req.ssl_sni``), lands a connection on the node it names: on the first try, unlike a
round-robin :class:`~resolvers.LoadBalancer`.  smartclient still checks the node each connection reports;
one that reached another node is :class:`~smartclient.Misrouted`, closed, and the next candidate is tried.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from smartclient._errors import ResolutionError, SmartClientError
from smartclient.core.address import Address
from smartclient.core.tls_names import checked_sni_name, default_sni_name
from smartclient.core.validation import function, instance

from .base import Resolver
from .load_balancer import listener

__all__ = ["SniRouter"]


class SniRouter(Resolver):
    """Dial the ingress's listener for the protocol, sending the *target node's* name as SNI (and verifying
    it: each node's certificate must carry the name that routes to it).

    ::

        SniRouter("ingress.example.com:5551", name=lambda node: node.split("@")[-1].split(".")[0] + ".example.com",
                  amqp=5671, mqtt_tls=8883)

    :param address: the ingress's stream TLS listener, ``host:port`` or an :class:`Address`.
    :param name: the SNI name of a node: a function of one string, the node as smartclient knows it (or of two:
        the node and the protocol, ``"stream"``, ``"amqp"`` or ``"mqtt"``, for an ingress that serves every
        protocol on one port, 443 say, and routes each protocol's connections by names of their own):

        * AMQP and MQTT (placed with the management API): the node's Erlang name, ``rabbit-1@localhost`` or,
          in Kubernetes, ``rabbit@rabbit-server-0.rabbit-nodes.ns``;
        * streams: the host the node advertises in the stream metadata (its ``advertised_host`` for TLS),
          ``rabbit-server-0.rabbit-nodes.ns``; the entry points of an Environment are given the same way, by the
          host of each (so name them by a node's advertised host, not by the ingress);
        * a connection whose node smartclient cannot name (an AMQP or MQTT entry point without the management
          API): the host of the address it aims at.

        None (the default): the host part of an Erlang name, and any other string as it is
        (:func:`~smartclient.core.tls_names.default_sni_name`): right when the ingress routes the names the nodes
        are called by, as the Kubernetes operator's pods are.  It must answer a DNS name (no IP address: TLS
        sends none as SNI), or the connection fails with :class:`~smartclient.ResolutionError`.
    :param amqp: the ingress's AMQPS (AMQP 0.9.1 over TLS) listener: a port on the same host, or ``host:port``.
    :param mqtt_tls: its MQTTS listener.
    :raises ConfigurationError: a listener or ``name`` that is none.

    It needs TLS (the Environment's ``tls=``) and no ``tls_server_name``: the name sent is the node's.  A
    certificate that does not verify for it is :class:`~smartclient.CertificateRejected` (never retried), whose
    message says the ingress may have misrouted the connection; a connection that reports another node is
    :class:`~smartclient.Misrouted` (and the next candidate is tried).  A node whose route is down fails like a
    node that is down, and placement falls through to the next candidate.
    """

    blocking = False

    def __init__(self, address: str | Address, *, name: Callable[..., str] | None = None,
                 amqp: int | str | Address | None = None, mqtt_tls: int | str | Address | None = None) -> None:
        instance("address", address, (str, Address), optional=False, what="'host:port' or an Address")
        function("name", name, takes="a node's name, and maybe the protocol")
        self.address = address if isinstance(address, Address) else Address.parse(address)
        self.name = name
        self._rule_name = name.__qualname__ if inspect.isfunction(name) or inspect.ismethod(name) else repr(name)
        self._per_protocol = name is not None and _takes_two(name)
        self.listeners: dict[str, Address] = {"stream": self.address}
        if amqp is not None:
            self.listeners["amqp"] = self.listeners["amqp/ssl"] = listener(
                self.address, "the SNI ingress's amqp listener", amqp)
        if mqtt_tls is not None:  # any MQTT through an SNI ingress is MQTT over TLS
            self.listeners["mqtt"] = self.listeners["mqtt/ssl"] = listener(
                self.address, "the SNI ingress's mqtt_tls listener", mqtt_tls)

    def option_for(self, protocol: str) -> str:
        """The option naming the listener for ``protocol`` (``amqp`` for AMQPS: every listener here is TLS)."""
        return "mqtt_tls" if protocol.startswith("mqtt") else protocol.replace("/ssl", "")

    def resolve(self, address: Address) -> Address:
        """Every stream connection dials the ingress (its name routes it)."""
        return self.address

    def listens(self) -> bool:
        return True

    def routes_by_name(self) -> bool:
        return True

    def address_for(self, protocol: str) -> Address | None:
        """The ingress's listener for ``protocol`` (``stream``, ``amqp`` or ``amqp/ssl``, ``mqtt`` or ``mqtt/ssl``:
        through an SNI ingress every connection is TLS), if it has one."""
        return self.listeners.get(protocol)

    def sni_name(self, node: str, protocol: str = "stream") -> str:
        """The name that routes to ``node`` over ``protocol`` (see ``name`` for the string ``node`` is), checked.

        :raises ResolutionError: the rule raised, or gave no DNS name."""
        if self.name is None:
            value: object = default_sni_name(node)
        else:
            try:
                value = self.name(node, protocol) if self._per_protocol else self.name(node)
            except SmartClientError:
                raise
            except Exception as exc:
                raise ResolutionError(f"{self!r}: the name function failed on node {node!r}: "
                                      f"{type(exc).__name__}: {exc}") from exc
        return checked_sni_name(value, node, f"{self!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SniRouter) and (other.listeners, other.name) == (self.listeners, self.name)

    def __hash__(self) -> int:
        return hash((SniRouter, self.name, tuple(sorted((k, str(v)) for k, v in self.listeners.items()))))

    def __repr__(self) -> str:
        extra = "".join(f", {option}={str(self.listeners[key])!r}" for option, key in
                        (("amqp", "amqp"), ("mqtt_tls", "mqtt/ssl")) if key in self.listeners)
        rule = f", name={self._rule_name}" if self.name is not None else ""
        return f"SniRouter({str(self.address)!r}{rule}{extra})"


def _takes_two(rule: Callable[..., str]) -> bool:
    """Can ``rule`` be called with two positional arguments (the node and the protocol)?  One that cannot be
    inspected (a builtin) is given the node alone."""
    try:
        inspect.signature(rule).bind("node", "protocol")
    except (TypeError, ValueError):
        return False
    return True
