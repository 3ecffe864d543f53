"""HAProxy in TCP mode in front of the cluster's stream, AMQP and MQTT ports.

Each listener is named ``<protocol>_<balance>`` (``stream_roundrobin``,
``amqp_roundrobin``, ``stream_source``...) and has one server per node, named
after the node (``rabbit-1``).  Faults go through the admin socket
(``disable server``, ``set server ... state maint``), and the sessions each
listener opened are read from ``show stat``.

The SNI frontends (``sni_stream_tls``, ``sni_amqp_tls``, ``sni_mqtt_tls``) pass TLS through, unopened, to the
node whose name the client's ClientHello carries (``rabbit-N.smartclient.test``, which the node's certificate
names), each to a backend of its own (``sni_<protocol>_<node>``, one server named after the node), as an ingress
in front of a cluster on Kubernetes does.  There is one frontend per protocol because a node's name routes the
same way for every protocol, so the name alone cannot also pick the protocol; ALPN could, but stream and AMQP
clients send none.  There is no default backend: a name the frontend does not know is refused.
"""

from __future__ import annotations

import csv
import io
import json
import resource
import shutil
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

from smartclient._errors import PrerequisiteMissing, TestBedError
from smartclient.testing.layout import BALANCE_EXPRESSIONS, LB_PROTOCOLS, SNI_PROTOCOLS, BrokerSpec, Layout
from smartclient.testing.processes import kill_pid, pid_alive, port_accepts, read_pid, wait_until

__all__ = ["HAProxy", "render_haproxy_config", "sni_backend", "sni_frontend"]

DEFAULT_LISTENERS = frozenset((protocol, "roundrobin") for protocol in LB_PROTOCOLS)


def render_haproxy_config(
    layout: Layout,
    nodes: Iterable[BrokerSpec],
    listeners: Iterable[tuple[str, str]],
    admin_socket: Path,
    maxconn: int = 9000,
) -> str:
    nodes = list(nodes)
    # a namespaced bed's HAProxy dials the nodes' own addresses from the one address its fence lets through
    source = f" source {layout.bed_network.lb_address}" if layout.namespaced else ""
    out = [
        "global",
        f"    stats socket {admin_socket} mode 600 level admin",
        f"    maxconn {maxconn}",
        "    nbthread 1",  # one thread keeps round-robin strictly in order
        "",
        "defaults",
        "    mode tcp",
        "    timeout connect 2s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout check 1s",
        "",
    ]
    for protocol, balance in sorted(listeners):
        out += [
            f"listen {protocol}_{balance}",
            f"    bind 127.0.0.1:{layout.lb_port(protocol, balance)}",
            f"    balance {BALANCE_EXPRESSIONS.get(balance, balance)}",
        ]
        out += [
            f"    server {node.short} {node.host}:{node.port(protocol)} check inter 1s fall 2 rise 2{source}"
            for node in nodes
        ]
        out.append("")
    for protocol in SNI_PROTOCOLS:
        out += [
            f"frontend {sni_frontend(protocol)}",
            f"    bind 127.0.0.1:{layout.sni_port(protocol)}",
            "    tcp-request inspect-delay 5s",
            "    tcp-request content accept if { req_ssl_hello_type 1 }",
        ]
        out += [f"    use_backend {sni_backend(protocol, node.short)} if {{ req.ssl_sni -i {node.tls_name} }}"
                for node in nodes]
        out.append("")
        for node in nodes:
            out += [
                f"backend {sni_backend(protocol, node.short)}",
                f"    server {node.short} {node.host}:{node.port(protocol)} check inter 1s fall 2 rise 2{source}",
                "",
            ]
    # each node's management API and stream port, on the loopback port it has in the loopback bed, for the test bed's
    # own tools (its probes), dialled from the LB's address and checked as the LB's backends are: a node the checks
    # find gone is refused at once (a request does not wait for a cut node until the proxy gives up)
    if layout.namespaced:
        for node in nodes:
            for what, port in (("management", node.management_port), ("stream", node.stream_port)):
                out += [f"listen {FORWARD_PREFIX}{what}_{node.short}", f"    bind 127.0.0.1:{port}",
                        f"    server {node.short} {node.host}:{port} check inter 1s fall 2 rise 2{source}", ""]
    return "\n".join(out)


FORWARD_PREFIX = "forward_"  #: a namespaced bed's forwards to each node's management API and stream port


def sni_frontend(protocol: str) -> str:
    """``sni_stream_tls`` for ``stream_tls``: the SNI frontend of a TLS listener."""
    return f"sni_{protocol}"


def sni_backend(protocol: str, node: str) -> str:
    """``sni_stream_tls_rabbit-2``: the backend the SNI frontend of ``protocol`` routes ``node``'s name to."""
    return f"sni_{protocol}_{node.split('@', 1)[0]}"


class HAProxy:
    """Start, reload and drive the test bed's HAProxy through its admin socket."""

    def __init__(self, layout: Layout, nodes: Iterable[BrokerSpec]) -> None:
        self.layout = layout
        self.nodes = list(nodes)
        self.dir = layout.run_dir / "haproxy"

    @property
    def admin_socket(self) -> Path:
        return self.dir / "admin.sock"

    @property
    def pid_file(self) -> Path:
        return self.dir / "haproxy.pid"

    @property
    def config_file(self) -> Path:
        return self.dir / "haproxy.cfg"

    def listeners(self) -> set[tuple[str, str]]:
        path = self.dir / "listeners.json"
        if not path.exists():
            return set(DEFAULT_LISTENERS)
        return set(DEFAULT_LISTENERS) | {(p, b) for p, b in json.loads(path.read_text())}

    def pid(self) -> int | None:
        pid = read_pid(self.pid_file)
        return pid if pid_alive(pid, must_contain="haproxy") else None

    def running(self) -> bool:
        return self.pid() is not None and self.admin_socket.exists()

    def _render(self, listeners: set[tuple[str, str]]) -> str:
        # HAProxy needs two descriptors per proxied connection and refuses to start if
        # maxconn asks for more than the hard limit allows.
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        maxconn = 30000 if hard == resource.RLIM_INFINITY else max(256, min(30000, (hard - 200) // 2))
        return render_haproxy_config(self.layout, self.nodes, listeners, self.admin_socket, maxconn)

    def ensure(self, listeners: Iterable[tuple[str, str]] = ()) -> None:
        """Run HAProxy with at least the default listeners plus ``listeners``; reload if they changed."""
        if shutil.which("haproxy") is None:
            raise PrerequisiteMissing(
                "HAProxy is not installed, and the test bed puts it in front of the cluster: "
                "run `apt-get install -y haproxy` (or ./dev, which does it)."
            )
        wanted = self.listeners() | set(listeners)
        config = self._render(wanted)
        if self.running() and self.config_file.exists() and self.config_file.read_text() == config:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(config)
        (self.dir / "listeners.json").write_text(json.dumps(sorted(wanted)))
        old = self.pid()
        cmd = ["haproxy", "-f", str(self.config_file), "-D", "-p", str(self.pid_file)]
        if old is not None:
            cmd += ["-sf", str(old)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise TestBedError(f"haproxy failed to start (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
        ports = [self.layout.lb_port(p, b) for p, b in wanted] + [self.layout.sni_port(p) for p in SNI_PROTOCOLS]
        wait_until(
            lambda: all(port_accepts(port) for port in ports),
            10,
            "HAProxy to listen",
        )
        wait_until(lambda: self.pid() not in (None, old), 10, "the new HAProxy process")

    def add_listener(self, protocol: str, balance: str) -> int:
        """Start a further listener with another balance algorithm (``random``, ``source``); return its port."""
        port = self.layout.lb_port(protocol, balance)
        self.ensure({(protocol, balance)})
        return port

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            kill_pid(pid, sig=15)

    # -- admin socket ------------------------------------------------------------------
    def command(self, line: str) -> str:
        if not self.admin_socket.exists():
            raise TestBedError(f"HAProxy admin socket {self.admin_socket} does not exist: is HAProxy running?")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.admin_socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def _server_command(self, template: str, node: str, listener: str | None) -> None:
        short = node.split("@", 1)[0]
        targets = [listener] if listener else [f"{p}_{b}" for p, b in sorted(self.listeners())]
        for target in targets:
            line = template.format(server=f"{target}/{short}")
            answer = self.command(line).strip()
            if answer:
                raise TestBedError(f"HAProxy refused `{line}`: {answer}")

    def disable_server(self, node: str, listener: str | None = None) -> None:
        """Take ``node`` out of one listener, or of every listener when ``listener`` is None."""
        self._server_command("disable server {server}", node, listener)

    def enable_server(self, node: str, listener: str | None = None) -> None:
        self._server_command("enable server {server}", node, listener)

    def shutdown_sessions(self, node: str, listener: str | None = None) -> None:
        """Cut every session HAProxy holds to ``node`` (in one listener, or all)."""
        self._server_command("shutdown sessions server {server}", node, listener)

    def set_maint(self, node: str, listener: str | None = None) -> None:
        self._server_command("set server {server} state maint", node, listener)

    def set_ready(self, node: str, listener: str | None = None) -> None:
        self._server_command("set server {server} state ready", node, listener)

    def stats(self) -> list[dict[str, str]]:
        """Rows of ``show stat`` (one per frontend, backend and server)."""
        text = self.command("show stat").lstrip("# ")
        return list(csv.DictReader(io.StringIO(text)))

    def sessions(self, listener: str) -> int:
        """Total sessions the listener's frontend accepted so far (``stot``)."""
        for row in self.stats():
            if row["pxname"] == listener and row["svname"] == "FRONTEND":
                return int(row["stot"] or 0)
        raise TestBedError(f"HAProxy has no listener named {listener!r}")

    # -- the SNI frontends ----------------------------------------------------------------
    def _sni_server(self, node: str, protocol: str) -> str:
        short = node.split("@", 1)[0]
        return f"{sni_backend(protocol, short)}/{short}"

    def _sni_command(self, line: str, accepted: tuple[str, ...] = ()) -> None:
        answer = self.command(line).strip()
        if answer and not any(word in answer for word in accepted):
            raise TestBedError(f"HAProxy refused `{line}`: {answer}")

    def disable_sni_route(self, node: str, protocol: str) -> None:
        """Put ``node``'s server in the SNI backend of ``protocol`` in maintenance: its name is refused."""
        self._sni_command(f"disable server {self._sni_server(node, protocol)}")

    def enable_sni_route(self, node: str, protocol: str) -> None:
        self._sni_command(f"enable server {self._sni_server(node, protocol)}")

    def route_sni_to(self, node: str, protocol: str, port: int, host: str = "127.0.0.1") -> None:
        """Send what the SNI frontend of ``protocol`` routes for ``node``'s name to ``host:port`` instead."""
        self._sni_command(f"set server {self._sni_server(node, protocol)} addr {host} port {port}",
                          accepted=("changed", "no need to change"))

    def restore_sni_routes(self) -> None:
        """Every SNI route back to its own node, and in service."""
        for protocol in SNI_PROTOCOLS:
            for node in self.nodes:
                self.route_sni_to(node.short, protocol, node.port(protocol), node.host)
                self._sni_command(f"set server {self._sni_server(node.short, protocol)} state ready")

    def sni_sessions(self, protocol: str) -> dict[str, int]:
        """Sessions the SNI frontend of ``protocol`` accepted (``"frontend"``) and each node's backend took
        (``"rabbit-1"``...), so far (``stot``); a refused name counts for the frontend only."""
        counts: dict[str, int] = {}
        backends = {sni_backend(protocol, node.short): node.short for node in self.nodes}
        for row in self.stats():
            if row["pxname"] == sni_frontend(protocol) and row["svname"] == "FRONTEND":
                counts["frontend"] = int(row["stot"] or 0)
            elif row["pxname"] in backends and row["svname"] == "BACKEND":
                counts[backends[row["pxname"]]] = int(row["stot"] or 0)
        if "frontend" not in counts:
            raise TestBedError(f"HAProxy has no SNI frontend for {protocol!r}")
        return counts

    def server_states(self, sni: bool = False) -> dict[str, dict[str, str]]:
        """``{listener: {server: status}}``, status as HAProxy says it (UP, DOWN, MAINT...); with ``sni``, the SNI
        frontends' instead: ``{"sni_stream_tls": {"rabbit-1": status, ...}}``."""
        backends = {sni_backend(protocol, node.short): (sni_frontend(protocol), node.short)
                    for protocol in SNI_PROTOCOLS for node in self.nodes}
        states: dict[str, dict[str, str]] = {}
        for row in self.stats():
            if (row["svname"] in ("FRONTEND", "BACKEND") or (row["pxname"] in backends) != sni
                    or row["pxname"].startswith(FORWARD_PREFIX)):
                continue
            proxy, server = backends.get(row["pxname"], (row["pxname"], row["svname"]))
            states.setdefault(proxy, {})[server] = row["status"]
        return states
