"""What every test bed offers: nodes, LB and DNS addresses, a status table, and faults.

Two kinds implement it: :class:`~smartclient.testing.local.LocalTestBed`
(the cluster, HAProxy and DNS server this machine runs) and
:class:`~smartclient.testing.external.ExternalTestBed` (a cluster the user
already has, described by ``SMARTCLIENT_TESTBED_EXTERNAL``).  A fault an
external test bed cannot inject raises :class:`FaultUnavailable`, which the
pytest plugin turns into a skip that says why.

This module knows none of its subclasses: :func:`smartclient.testing.from_env`
picks one.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smartclient._errors import FaultUnavailable, ManagementError
from smartclient.management import ManagementClient
from smartclient.testing.certificates import ClientCertificate
from smartclient.testing.processes import wait_until

if TYPE_CHECKING:
    from smartclient.testing.oauth import TokenAuthority

__all__ = ["Node", "TestBed"]


@dataclass(frozen=True)
class Node:
    """A broker as clients see it: where to dial each protocol, and what its stream listener advertises."""

    name: str
    host: str
    stream_port: int
    amqp_port: int
    mqtt_port: int
    management_port: int
    advertised_host: str
    advertised_port: int
    stream_tls_port: int = 0  # 0: no TLS listener
    advertised_tls_host: str = ""
    mqtt_tls_port: int = 0  # 0: no TLS listener
    amqp_tls_port: int = 0  # 0: no TLS listener
    #: where its management API (and, for the test bed's probes, its stream port) answers, if not on ``host``: a
    #: namespaced node's forwards, through the LB's address
    management_host: str = ""

    @property
    def short(self) -> str:
        return self.name.split("@", 1)[0]

    def port(self, protocol: str) -> int:
        ports = {"stream": self.stream_port, "amqp": self.amqp_port, "mqtt": self.mqtt_port,
                 "management": self.management_port, "stream_tls": self.stream_tls_port,
                 "mqtt_tls": self.mqtt_tls_port, "amqp_tls": self.amqp_tls_port}
        return ports[protocol]

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host, self.advertised_port)

    @property
    def advertised_tls(self) -> tuple[str, int]:
        return (self.advertised_tls_host, self.stream_tls_port)

    @property
    def management_url(self) -> str:
        return f"http://{self.management_host or self.host}:{self.management_port}"


class TestBed:
    """Base class: addresses and read-only queries; every fault raises :class:`FaultUnavailable`."""

    __test__ = False
    kind = "abstract"

    def __init__(self, nodes: tuple[Node, ...], username: str, password: str) -> None:
        self.nodes = nodes
        self.username = username
        self._password = password
        self._rabbitmq_version: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nodes={[n.name for n in self.nodes]}, username={self.username!r})"

    @property
    def password(self) -> str:
        return self._password

    # -- addresses ---------------------------------------------------------------------
    def node(self, name: str) -> Node:
        for node in self.nodes:
            if name in (node.name, node.short):
                return node
        raise KeyError(f"no node {name!r} in this test bed; nodes: {[n.short for n in self.nodes]}")

    def node_by_advertised(self, host: str, port: int) -> Node:
        for node in self.nodes:
            if (host, int(port)) in (node.advertised, node.advertised_tls):
                return node
        raise KeyError(f"no node advertises {host}:{port}")

    def lb(self, protocol: str = "stream", balance: str = "roundrobin") -> tuple[str, int]:
        raise FaultUnavailable(f"this {self.kind} test bed has no {balance} load balancer for {protocol}")

    @property
    def dns_address(self) -> tuple[str, int]:
        raise FaultUnavailable(f"this {self.kind} test bed has no DNS server")

    @property
    def ca_file(self) -> Path:
        raise FaultUnavailable(f"this {self.kind} test bed has no TLS listeners of its own")

    def tls_context(self) -> ssl.SSLContext:
        """A client context that trusts the test bed's CA, with hostname checks on."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def stream_uri(self, host: str, port: int, vhost: str = "/") -> str:
        """A ``rabbitmq-stream://`` URI with this test bed's credentials (keep it out of logs)."""
        from urllib.parse import quote

        return (f"rabbitmq-stream://{quote(self.username, safe='')}:{quote(self._password, safe='')}"
                f"@{host}:{port}/{quote(vhost, safe='')}")

    def management(self, node: str | None = None, timeout: float = 10.0) -> ManagementClient:
        """A management client of ``node``, or (None) of the cluster: every node, the first one asked first."""
        urls = [self.node(node).management_url] if node else [n.management_url for n in self.nodes]
        return ManagementClient(urls, self.username, self._password, timeout)

    def running_nodes(self, timeout: float = 2.0) -> set[str]:
        """The nodes the first node's management API reports running (none when it does not answer in time)."""
        try:
            with self.management(self.nodes[0].name, timeout) as api:
                return {str(n.get("name")) for n in api.nodes() if n.get("running")}
        except ManagementError:
            return set()

    def rabbitmq_version(self) -> str:
        """The RabbitMQ version the cluster runs, as its management API reports it (``4.3.6``)."""
        if self._rabbitmq_version is None:
            with self.management() as api:
                self._rabbitmq_version = str(api.overview().get("rabbitmq_version", "?"))
        return self._rabbitmq_version

    def stream_leader(self, stream: str, vhost: str = "/") -> str:
        """The node name hosting the stream's leader, as the management API reports it."""
        with self.management() as api:
            leader: str = api.queue(vhost, stream)["leader"]
        return leader

    def close_connection(self, name: str) -> None:
        """Close a client connection by its name through the management API."""
        with self.management() as api:
            api.close_connection(name, reason="closed by the smartclient test bed")

    def connection_named(self, client_name: str, timeout: float = 30.0) -> str:
        """The server's name (for :meth:`close_connection`) of the connection a client opened with the
        ``connection_name`` ``client_name``.  It waits: the management API lists a connection after its next
        statistics round, a few seconds after it opened.

        :raises TestBedError: the management API did not list it within ``timeout`` s.
        """
        def listed() -> str | None:
            with self.management() as api:
                found = [conn for conn in api.connections()
                         if (conn.get("client_properties") or {}).get("connection_name") == client_name]
            if not found:
                return None
            # another process may use the same name: the newest is the one just opened
            return str(max(found, key=lambda conn: conn.get("connected_at") or 0)["name"])

        name = wait_until(listed, timeout, f"the management API to list the connection {client_name!r}",
                          interval=0.2)
        assert name is not None  # wait_until returns only a true value
        return name

    # -- the locked bed: tokens, client certificates, SNI (a local test bed overrides them) ------
    @property
    def tokens(self) -> TokenAuthority:
        """The identity provider whose tokens (RS256 JWTs) every node accepts as passwords."""
        raise FaultUnavailable(f"this {self.kind} test bed has no identity provider of its own to mint OAuth2 tokens")

    def client_certificate(self, common_name: str = "smartclient-client") -> ClientCertificate:
        """The current client certificate for ``common_name`` from the bed's CA (issued on first use), for SASL
        EXTERNAL; the broker user of that name exists (no password, full permissions on ``/``)."""
        raise FaultUnavailable(f"this {self.kind} test bed has no CA of its own to issue a client certificate for "
                               f"{common_name!r}")

    def rotate_client_certificate(self, common_name: str = "smartclient-client") -> ClientCertificate:
        """The fault "a certificate rotated": a new certificate for ``common_name`` (new key pair and serial, new
        files), which :meth:`client_certificate` returns from now on; the old one stays valid."""
        raise self._unavailable(f"rotate the client certificate of {common_name!r}")

    def sni(self, protocol: str = "stream") -> tuple[str, int]:
        """The SNI frontend of ``stream``, ``amqp`` or ``mqtt`` (their TLS listeners): the node a connection
        lands on is the one its SNI names (``rabbit-N.smartclient.test``); an unknown name is refused."""
        raise FaultUnavailable(f"this {self.kind} test bed has no SNI frontend for {protocol}")

    def sni_route_down(self, node: str, protocol: str = "stream") -> None:
        raise self._unavailable(f"take the SNI route to {node} down")

    def sni_route_up(self, node: str, protocol: str = "stream") -> None:
        raise self._unavailable(f"bring the SNI route to {node} up")

    def sni_misroute(self, node: str, to_node: str, protocol: str = "stream") -> None:
        raise self._unavailable(f"misroute the SNI name of {node}")

    def sni_route_restore(self, node: str, protocol: str = "stream") -> None:
        raise self._unavailable(f"restore the SNI route to {node}")

    def sni_sessions(self, protocol: str = "stream") -> dict[str, int]:
        """Sessions the SNI frontend of ``protocol`` took so far: ``{"frontend": n, "rabbit-1": n, ...}``."""
        raise FaultUnavailable(f"this {self.kind} test bed has no SNI frontend for {protocol}")

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        raise NotImplementedError

    def status_table(self) -> str:
        return render_status(self.status())

    # -- faults (a local test bed overrides them) ---------------------------------------
    def _unavailable(self, what: str) -> FaultUnavailable:
        return FaultUnavailable(f"the {self.kind} test bed cannot {what}")

    def kill_node(self, name: str) -> int:
        raise self._unavailable(f"kill -9 {name}")

    def restart_node(self, name: str) -> None:
        raise self._unavailable(f"restart {name}")

    def stop_app(self, name: str) -> None:
        raise self._unavailable(f"stop_app on {name}")

    def start_app(self, name: str) -> None:
        raise self._unavailable(f"start_app on {name}")

    def roll_node(self, name: str, full: bool = False, before_stop: Callable[[], object] | None = None) -> float:
        raise self._unavailable(f"restart {name} as a rolling restart does")

    def move_leader(self, stream: str, to_node: str, vhost: str = "/") -> str:
        raise self._unavailable(f"move the leader of {stream}")

    def stream_status(self, stream: str, vhost: str = "/") -> list[dict[str, Any]]:
        raise self._unavailable(f"read the stream coordinator's view of {stream}")

    def suspend_stream_member(self, stream: str, node: str, seconds: float, vhost: str = "/") -> None:
        raise self._unavailable(f"suspend the member of {stream} on {node}")

    def advertise_hostnames(self, enabled: bool = True) -> None:
        raise self._unavailable("make the nodes advertise container-style host names")

    def partition(self, what: str, node: str, *, minority: Sequence[str] = (), direction: str = "both") -> Any:
        raise self._unavailable(f"partition {node} ({what})")

    def disable_lb_backend(self, node: str, listener: str | None = None) -> None:
        raise self._unavailable(f"disable the LB backend {node}")

    def enable_lb_backend(self, node: str, listener: str | None = None) -> None:
        raise self._unavailable(f"enable the LB backend {node}")

    def shutdown_lb_sessions(self, node: str, listener: str | None = None) -> None:
        raise self._unavailable(f"cut the LB sessions to {node}")

    def restart_lb(self) -> None:
        raise self._unavailable("restart the load balancer")

    def stop_dns(self) -> None:
        raise self._unavailable("stop the DNS server")

    def start_dns(self) -> None:
        raise self._unavailable("start the DNS server")

    def add_dns_record(self, name: str, type: str, value: str, ttl: int = 30) -> None:
        raise self._unavailable("add DNS records")

    def start_brokers(self, count: int) -> tuple[Node, ...]:
        raise self._unavailable("start extra independent brokers")

    def stop_brokers(self) -> None:
        raise self._unavailable("stop extra independent brokers")

    def heal(self) -> None:
        """Undo every fault: nodes back, apps started, LB backends up, DNS answering."""


def render_status(status: dict[str, Any]) -> str:
    """The status table printed by ``python -m smartclient.testing status``."""
    lines = [f"smartclient test bed: {status['kind']}   {status.get('versions', '')}"]
    header = (f"{'NODE':<22}{'PID':>8}  {'STATE':<10}{'AMQP':>7}{'STREAM':>8}{'TLS':>7}{'MQTT':>7}{'MGMT':>7}"
              f"  ADVERTISED (stream; TLS)")
    lines += ["", header]
    for n in status["nodes"]:
        lines.append(
            f"{n['name']:<22}{n.get('pid') or '-':>8}  {n['state']:<10}{n['amqp']:>7}{n['stream']:>8}"
            f"{n.get('stream_tls') or '-':>7}{n['mqtt']:>7}{n['management']:>7}  {n['advertised']}"
        )
    if status.get("cluster"):
        lines.append(f"cluster: {status['cluster']}")
    if status.get("lb"):
        lines += ["", f"{'LB LISTENER':<22}{'ADDRESS':<18}BACKENDS"]
        for listener in status["lb"]:
            backends = ", ".join(f"{k} {v}" for k, v in listener["backends"].items())
            lines.append(f"{listener['name']:<22}{listener['address']:<18}{backends}")
    if status.get("dns"):
        dns = status["dns"]
        lines += ["", f"DNS {dns['address']}  {dns['state']}  zone {dns['zone']}  {dns['records']} records"]
    if status.get("brokers"):
        lines += ["", "extra brokers: " + ", ".join(status["brokers"])]
    return "\n".join(lines)

