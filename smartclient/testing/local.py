"""The local test bed: a 3-node RabbitMQ cluster (4.3 or 4.0), HAProxy and a DNS server on loopback.

``up()`` is idempotent: a healthy running test bed is reused as it is, a
node that died is restarted with its data, and a cluster that cannot be
healed is wiped and formed again.  Every fault has its undo, and
:meth:`LocalTestBed.heal` applies all of them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartclient._errors import ManagementError, PrerequisiteMissing, TestBedError
from smartclient.testing.broker import BrokerProcess
from smartclient.testing.certificates import ensure_certificates
from smartclient.testing.chroot import RabbitChroot
from smartclient.testing.layout import PORT_SPAN, SNI_PROTOCOLS, BrokerSpec, Layout, PortUse
from smartclient.testing.loadbalancer import HAProxy, sni_frontend
from smartclient.testing.locked import LockedLocalBed
from smartclient.testing.nameserver import ZONE, DnsServer
from smartclient.testing.oauth import ensure_signing_key
from smartclient.testing.partitions import PartitionableBed
from smartclient.testing.ports import BedIdentity, find_taken_ports, refusal
from smartclient.testing.prestop import await_quorum_plus_one, orphan_streams
from smartclient.testing.processes import ephemeral_port_range, wait_until
from smartclient.testing.testbed import Node

__all__ = ["LocalTestBed", "UpReport"]

log = logging.getLogger(__name__)

USERNAME = "guest"
PASSWORD = "guest"  # the loopback-only default user of a throwaway broker


@dataclass
class UpReport:
    """What ``up()`` did and how long each step took, in seconds."""

    provision: float = 0.0
    cluster: float = 0.0
    lb: float = 0.0
    dns: float = 0.0
    total: float = 0.0
    reused: bool = False
    actions: list[str] = field(default_factory=list)


def _node(spec: BrokerSpec) -> Node:
    """A node as clients see it.  A namespaced one is dialled on its own address and advertises its own host name;
    its management API answers on 127.0.0.1 (HAProxy forwards it from the port it has in the loopback bed)."""
    return Node(spec.name, spec.host, spec.stream_port, spec.amqp_port, spec.mqtt_port,
                spec.management_port, advertised_host=spec.hostname, advertised_port=spec.stream_port,
                stream_tls_port=spec.stream_tls_port, advertised_tls_host=spec.hostname,
                mqtt_tls_port=spec.mqtt_tls_port, amqp_tls_port=spec.amqp_tls_port,
                management_host="127.0.0.1" if spec.netns else "")


class LocalTestBed(PartitionableBed, LockedLocalBed):
    kind = "local"

    def __init__(self, layout: Layout) -> None:
        super().__init__(tuple(_node(s) for s in layout.nodes), USERNAME, PASSWORD)
        self.layout = layout
        self.chroot = RabbitChroot(layout.chroot, layout.release.suite, layout.release.script)
        self.brokers = [BrokerProcess(s, layout, self.chroot) for s in layout.nodes]
        self.haproxy = HAProxy(layout, layout.nodes)
        self.dns = DnsServer(layout, layout.nodes)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LocalTestBed:
        return cls(Layout.from_env(environ))

    def broker(self, name: str) -> BrokerProcess:
        spec = self.layout.node(name)
        for b in self.brokers:
            if b.spec == spec:
                return b
        return BrokerProcess(spec, self.layout, self.chroot)

    # -- prerequisites -----------------------------------------------------------------
    def check_prerequisites(self) -> None:
        """Raise :class:`PrerequisiteMissing` with one sentence for the first thing missing."""
        if os.geteuid() != 0:
            raise PrerequisiteMissing(
                "the local test bed must run as root (it builds a chroot with debootstrap, mounts /proc "
                "in it and runs RabbitMQ there): run as root, or attach to your own cluster with "
                "SMARTCLIENT_TESTBED_EXTERNAL"
            )
        for tool, package in (("haproxy", "haproxy"), ("chroot", "coreutils"), ("mount", "mount")):
            if shutil.which(tool) is None:
                raise PrerequisiteMissing(f"`{tool}` is not installed: run `apt-get install -y {package}`")
        if not self.chroot.provisioned and shutil.which("debootstrap") is None:
            raise PrerequisiteMissing(
                "debootstrap is not installed, and the test bed needs it to install RabbitMQ: "
                "run `apt-get install -y debootstrap` (or ./dev, which does it)"
            )
        self._check_ports()

    def _check_ports(self) -> None:
        low, high = ephemeral_port_range()
        if self.layout.overlaps(low, high):
            raise PrerequisiteMissing(
                f"port base {self.layout.base} puts the test bed's ports inside the kernel's ephemeral range "
                f"{low}-{high}, where outgoing connections can take them before a listener binds: set "
                f"SMARTCLIENT_TESTBED_PORT_BASE below {low - PORT_SPAN}"
            )
        self._refuse_taken_ports(self.layout.port_uses())

    def _refuse_taken_ports(self, uses: Iterable[PortUse]) -> None:
        """Raise :class:`PrerequisiteMissing` naming the first port of ``uses`` held by a process that is not this
        bed's own, and that process.  Own means started for this release's chroot and this port base (see
        :class:`~smartclient.testing.ports.BedIdentity`): an ``up()`` on the running bed passes; one beside
        another bed that holds its ports refuses at once, before it starts anything."""
        taken = find_taken_ports(uses, BedIdentity.of(self.layout))
        if taken:
            raise PrerequisiteMissing(refusal(taken, self.layout.base))

    # -- up / down ---------------------------------------------------------------------
    def up(self) -> UpReport:
        report = UpReport()
        started = time.monotonic()
        self.check_prerequisites()
        report.provision = self.chroot.provision()
        if report.provision:
            report.actions.append(f"provisioned RabbitMQ {self.chroot.rabbitmq_version()} in {self.chroot.root}")
        if self.layout.namespaced:  # the nodes' network, and their names in /etc/hosts (the chroot copies it)
            self.layout.bed_network.up()
            self.layout.bed_network.write_hosts(True)
            report.actions.append(f"made the network {self.layout.bed_network.subnet}.0/24 "
                                  f"({'routable' if self.layout.routable else 'lb-only'})")
        self.chroot.ensure_proc()
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        all_specs = [*self.layout.nodes, *(self.layout.extra_broker(i) for i in range(1, 7))]
        ensure_certificates(self.layout.run_dir / "tls", all_specs)
        ensure_signing_key(self.layout.run_dir / "tls")

        t = time.monotonic()
        report.reused = self._ensure_cluster(report.actions)
        report.cluster = time.monotonic() - t

        t = time.monotonic()
        was_running = self.haproxy.running()
        self.haproxy.ensure()
        if not was_running:
            report.actions.append("started HAProxy")
        report.lb = time.monotonic() - t

        t = time.monotonic()
        if not self.dns.running():
            self.dns.start()
            report.actions.append("started the DNS server")
        report.dns = time.monotonic() - t
        self._wait_lb_backends_up()
        report.total = time.monotonic() - started
        return report

    def _cluster_members(self) -> set[str]:  # running nodes as rabbit-1 sees them (none if it does not answer)
        try:
            out = self.brokers[0].ctl(["cluster_status", "--formatter", "json"], timeout=30)
            return set(json.loads(out).get("running_nodes", []))
        except (TestBedError, ValueError):
            return set()

    def clustered(self) -> bool:  # the management API first: ms, where rabbitmqctl takes a second or more
        names = {b.spec.name for b in self.brokers}
        return self.running_nodes() == names or self._cluster_members() == names

    def _ensure_cluster(self, actions: list[str]) -> bool:
        """Make the 3-node cluster run; return True if it was already healthy."""
        if (all(b.running() and b.listening() and b.config_current() for b in self.brokers)
                and self.clustered()):
            return True
        try:
            self._start_and_join(actions)
            return False
        except TestBedError as exc:
            log.warning("cluster could not be healed (%s); wiping and forming it again", exc)
            actions.append(f"reset the cluster ({exc})")
        for b in self.brokers:
            if b.running():
                b.kill()
            b.wipe()
        self._start_and_join(actions)
        return False

    def _start_and_join(self, actions: list[str]) -> None:
        for b in self.brokers:  # a config this version renders differently: rolling restart, one at a time
            if b.running() and not b.config_current():
                b.stop()
                b.start()
                b.wait_ready()
                actions.append(f"restarted {b.spec.name} with a new config")
        fresh = {b.spec.name for b in self.brokers if b.fresh}
        for b in self.brokers:
            if not b.running():
                b.start()
                actions.append(f"started {b.spec.name}" + (" (fresh)" if b.spec.name in fresh else ""))
        for b in self.brokers:
            b.wait_ready()
        seed = self.brokers[0]
        for b in self.brokers[1:]:
            if b.spec.name in fresh:
                b.ctl(["stop_app"])
                b.ctl(["join_cluster", seed.spec.name])
                b.ctl(["start_app"])
                actions.append(f"joined {b.spec.name} to {seed.spec.name}")
        wait_until(self.clustered, 60, "all three nodes to run in one cluster", interval=1.0)

    def _wait_lb_backends_up(self, timeout: float = 30.0) -> None:
        def all_up() -> bool:
            states = self.haproxy.server_states() | self.haproxy.server_states(sni=True)
            return bool(states) and all(s == "UP" for servers in states.values() for s in servers.values())

        wait_until(all_up, timeout, "every HAProxy backend to be UP", interval=0.25)

    def down(self, wipe: bool = False) -> None:
        """Stop everything this test bed started (and delete node data with ``wipe``).  The loopback bed's down
        takes down a namespaced bed at its port base too."""
        if not self.layout.namespaced and self.layout.base % 100 == 0:
            namespaced = LocalTestBed(dataclasses.replace(self.layout, network="namespaces"))
            if namespaced.layout.bed_network.exists() or namespaced.haproxy.running() or namespaced.dns.running():
                namespaced.down(wipe)
        self.dns.stop()
        self.haproxy.stop()
        extra = [self.broker(f"broker-{i}") for i in range(1, 7)]
        for b in [*self.brokers, *extra]:
            if b.running():
                b.kill()
            if wipe:
                b.wipe()
        self._stop_epmd()
        network = self.layout.bed_network if self.layout.base % 100 == 0 else None
        if network is not None and (self.layout.namespaced or network.exists()):
            network.down()  # every process left in its namespaces too
            network.write_hosts(False)
            if self.chroot.provisioned:
                self.chroot.copy_hosts()
        self.chroot.release()
        if wipe:
            shutil.rmtree(self.layout.run_dir, ignore_errors=True)

    def _stop_epmd(self) -> None:
        env = {"ERL_EPMD_PORT": str(self.layout.epmd_port)}
        erts = sorted((self.chroot.root / "usr/lib/erlang").glob("erts-*/bin/epmd"))
        if erts:
            inner = "/" + str(erts[-1].relative_to(self.chroot.root))
            subprocess.run(["chroot", str(self.chroot.root), inner, "-kill"], env=self.chroot.env(env),
                           capture_output=True, check=False)

    # -- addresses ---------------------------------------------------------------------
    def lb(self, protocol: str = "stream", balance: str = "roundrobin") -> tuple[str, int]:
        if (protocol, balance) not in self.haproxy.listeners():
            self.haproxy.add_listener(protocol, balance)
            self._wait_lb_backends_up()
        return ("127.0.0.1", self.layout.lb_port(protocol, balance))

    @property
    def dns_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.layout.dns_port)

    @property
    def ca_file(self) -> Path:
        return self.layout.run_dir / "tls" / "ca.pem"

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        nodes = []
        for b in [*self.brokers, *(self.broker(f"broker-{i}") for i in range(1, 7))]:
            pid = b.pid()
            if not b.spec.clustered and pid is None:
                continue
            state = "down" if pid is None else ("running" if b.listening() else "app-stopped")
            nodes.append({
                "name": b.spec.name, "pid": pid, "state": state, "amqp": b.spec.amqp_port,
                "stream": b.spec.stream_port, "mqtt": b.spec.mqtt_port, "management": b.spec.management_port,
                "stream_tls": b.spec.stream_tls_port,
                "advertised": f"{self._advertised_host(b)}:{b.spec.stream_port}; TLS port {b.spec.stream_tls_port}",
            })
        members = self._cluster_members() if self.brokers[0].running() else set()
        lb = []
        if self.haproxy.running():
            states = self.haproxy.server_states()
            for protocol, balance in sorted(self.haproxy.listeners()):
                name = f"{protocol}_{balance}"
                lb.append({"name": name, "address": f"127.0.0.1:{self.layout.lb_port(protocol, balance)}",
                           "backends": states.get(name, {})})
            sni_states = self.haproxy.server_states(sni=True)
            for protocol in SNI_PROTOCOLS:
                lb.append({"name": sni_frontend(protocol), "address": f"127.0.0.1:{self.layout.sni_port(protocol)}",
                           "backends": sni_states.get(sni_frontend(protocol), {})})
        dns = {"address": f"127.0.0.1:{self.layout.dns_port}",
               "state": "running" if self.dns.running() else "stopped",
               "zone": ZONE, "records": len(self.dns.records())}
        return {
            "kind": f"local (port base {self.layout.base}, chroot {self.chroot.root}, {self._network()})",
            "versions": self._versions(),
            "nodes": nodes,
            "cluster": f"{len(members)} running: {', '.join(sorted(members))}" if members else "not running",
            "lb": lb,
            "dns": dns,
        }

    def _network(self) -> str:
        if not self.layout.namespaced:
            return "network loopback"
        net = self.layout.bed_network
        return (f"network namespaces {net.subnet}.0/24, {'routable' if net.routable else 'lb-only'}, "
                + ", ".join(f"{b.spec.short} in {b.spec.netns} at {b.spec.host}" for b in self.brokers))

    def _versions(self) -> str:
        parts = [f"RabbitMQ {self.chroot.rabbitmq_version()}"]
        try:
            with self.management() as api:
                parts.append(f"Erlang {api.overview().get('erlang_version', '?')}")
        except Exception:
            pass
        try:
            out = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.split()
            parts.append(f"HAProxy {out[2]}")
        except (OSError, IndexError):
            pass
        return ", ".join(parts)

    # -- faults ------------------------------------------------------------------------
    def kill_node(self, name: str) -> int:
        """``kill -9`` the node's beam process by its PID; return the PID."""
        return self.broker(name).kill()

    def restart_node(self, name: str) -> None:
        broker = self.broker(name)
        broker.start()
        broker.wait_ready()
        if broker.spec.clustered:
            wait_until(self.clustered, 60, f"{broker.spec.name} to rejoin the cluster", interval=0.5)

    def stop_app(self, name: str) -> None:
        self.broker(name).ctl(["stop_app"])

    def start_app(self, name: str) -> None:
        broker = self.broker(name)
        broker.ctl(["start_app"])
        broker.wait_ready()

    def roll_node(self, name: str, full: bool = False, before_stop: Callable[[], object] | None = None) -> float:
        """One step of a rolling restart, as the Kubernetes cluster operator takes it: wait until the node can go
        without costing any quorum queue or stream its quorum (``rabbitmq-upgrade await_online_quorum_plus_one``,
        the operator's pre-stop check), stop it (``stop_app``, or with ``full`` the whole process, gracefully),
        start it and wait until it listens and has rejoined the cluster.  ``before_stop`` is called (on this thread)
        once the check has passed, just before the stop.  Returns the seconds it was down."""
        broker = self.broker(name)
        await_quorum_plus_one(broker)
        if before_stop is not None:
            before_stop()
        stopped = time.monotonic()
        if full:
            broker.stop()
            broker.start()
        else:
            broker.ctl(["stop_app"])
            broker.ctl(["start_app"])
        broker.wait_ready()
        down = time.monotonic() - stopped
        if broker.spec.clustered:
            wait_until(self.clustered, 60, f"{broker.spec.name} to rejoin the cluster", interval=0.5)
        return down

    def orphan_streams(self, name: str) -> list[tuple[str, str]]:
        """``(vhost, stream)`` of each stream record on node ``name`` that the stream coordinator does not know
        (see :mod:`smartclient.testing.prestop`)."""
        return orphan_streams(self.broker(name))

    def stream_status(self, stream: str, vhost: str = "/") -> list[dict[str, Any]]:
        """The stream coordinator's view of each member (``rabbitmq-streams stream_status``): role, node,
        epoch, offset, committed_offset.  Unlike the management API it is never a statistics round late."""
        out = self.brokers[0].tool("rabbitmq-streams",
                                   ["stream_status", "--vhost", vhost, stream, "--formatter", "json"], timeout=30)
        rows: list[dict[str, Any]] = json.loads(out)
        return rows

    def suspend_stream_member(self, stream: str, node: str, seconds: float, vhost: str = "/") -> None:
        """Suspend ``stream``'s member process on ``node`` (the writer on the leader, a replica elsewhere) for
        ``seconds`` (``sys:suspend``, then ``sys:resume``, in the node): its connections stay, and it neither
        writes, confirms nor replicates meanwhile."""
        self._suspend(node, _member(stream, vhost), seconds)

    def _suspend(self, node: str, pid: str, seconds: float) -> None:
        """Suspend the process the Erlang expression ``pid`` names on ``node`` for ``seconds``; a process in the
        node resumes it, so it resumes even if the caller dies.  :meth:`_resume` resumes it sooner."""
        self.broker(node).ctl(["eval", f"P = {pid}, true = is_pid(P), spawn(fun() -> sys:suspend(P, infinity), "
                                       f"timer:sleep({int(seconds * 1000)}), catch sys:resume(P) end), ok."])

    def _resume(self, node: str, pid: str) -> None:
        self.broker(node).ctl(["eval", f"catch sys:resume({pid}), ok."])

    def move_leader(self, stream: str, to_node: str, vhost: str = "/") -> str:
        """Restart the stream with ``to_node`` as preferred leader; return the new leader once it moved.

        The coordinator elects the new writer as soon as a quorum of members stopped, among those of them
        holding the longest tail, and honours the preferred node only among those (``select_leader`` in
        ``rabbit_stream_coordinator``, 4.0 to 4.3).  So a plain restart often elects another node: the writer
        is ahead of the replicas under a producer, and the target may not be among the first to stop.  Each
        try therefore (1) holds back the other members' stops, by suspending ``osiris_server_sup`` on their
        nodes (the coordinator stops a member through it), (2) suspends the writer until the target holds
        its whole tail, and (3) restarts the stream: the first quorum is the writer and the target, with
        equal tails, and the preferred target wins.  The writer stops at once when suspended; the held
        supervisors are resumed as soon as the restart returned (and after 5 s regardless).  A try that does
        not move the writer within 8 s is repeated, for up to 90 s; the error then shows the members' last
        status.  A restart is a leader change for clients (a MetadataUpdate), and producers see no confirm
        while the writer is suspended (well under a second)."""
        target = self.layout.node(to_node).name
        deadline = time.monotonic() + 90
        last: list[dict[str, Any]] = []

        def status() -> list[dict[str, Any]]:
            nonlocal last
            last = self.stream_status(stream, vhost)
            return last

        def target_in_sync() -> bool:
            rows = status()
            writer = [r for r in rows if r.get("role") == "writer"]
            mine = [r for r in rows if r.get("node") == target]
            if not (writer and mine and isinstance(mine[0].get("offset"), int)):
                return False
            return bool(mine[0]["offset"] >= writer[0].get("committed_offset", 0))

        def writer_on_target() -> bool:
            return any(r.get("role") == "writer" and r.get("node") == target for r in status())

        def target_caught_up() -> bool:  # with the (suspended) writer's tail, not only its commit
            rows = status()
            writer = [r.get("offset") for r in rows if r.get("role") == "writer"]
            mine = [r.get("offset") for r in rows if r.get("node") == target]
            return bool(writer and mine and isinstance(mine[0], int) and mine[0] >= (writer[0] or 0))

        tries = 0
        while True:
            tries += 1
            held: list[tuple[str, str]] = []  # (node, process) suspended by this try
            try:
                wait_until(target_in_sync, 20, f"the member of {stream} on {target} to be in sync", interval=0.25)
                writer = next(r["node"] for r in last if r.get("role") == "writer")
                if writer == target:
                    return target
                for row in last:
                    if row.get("node") not in (writer, target):
                        try:  # best effort: a node that is down or stopped holds nothing back anyway
                            self._suspend(row["node"], "whereis(osiris_server_sup)", 5.0)
                            held.append((row["node"], "whereis(osiris_server_sup)"))
                        except TestBedError as exc:
                            log.info("moving the leader of %s: %s is not held back (%s)", stream, row["node"], exc)
                self._suspend(writer, _member(stream, vhost), 7.0)
                held.append((writer, _member(stream, vhost)))
                wait_until(target_caught_up, 5, f"the member of {stream} on {target} to hold the writer's tail",
                           interval=0.05)  # (3 s was too short once in CI, six tries in a row)
                self.brokers[0].tool(
                    "rabbitmq-streams",
                    ["restart_stream", "--vhost", vhost, stream, "--preferred-leader-node", target],
                )
                held = [h for h in held if h[0] != writer]  # the writer stopped: nothing to resume there
                self._resume_all(held)
                held = []
                wait_until(writer_on_target, 8, f"the leader of {stream} to move to {target}", interval=0.25)
                return target
            except (TestBedError, StopIteration) as exc:
                if time.monotonic() > deadline:
                    raise TestBedError(f"{exc}; the members' last status: {json.dumps(last)}") from exc
                log.warning("moving the leader of %s (try %d): %s; trying again", stream, tries, exc)
            finally:
                self._resume_all(held)

    def _resume_all(self, held: list[tuple[str, str]]) -> None:
        for node, pid in held:
            try:
                self._resume(node, pid)
            except TestBedError as exc:  # its own timer resumes it
                log.warning("resuming %s on %s: %s", pid, node, exc)

    def advertise_hostnames(self, enabled: bool = True) -> None:
        """The container case: each node advertises ``rabbit-N.smartclient.test``, a name only the test
        bed's DNS server knows, in Metadata and Open responses (``stream.advertised_host``, set at run
        time, so no restart).  ``heal()`` and ``advertise_hostnames(False)`` restore ``localhost``."""
        for b in self.brokers:
            if enabled:
                expr = f'application:set_env(rabbitmq_stream, advertised_host, <<"{b.spec.tls_name}">>).'
            elif b.spec.netns:  # its own host name, as its config says
                expr = f'application:set_env(rabbitmq_stream, advertised_host, <<"{b.spec.hostname}">>).'
            else:
                expr = "application:unset_env(rabbitmq_stream, advertised_host)."
            b.ctl(["eval", expr])
        self.nodes = tuple(
            dataclasses.replace(n, advertised_host=b.spec.tls_name if enabled else b.spec.hostname,
                                advertised_tls_host=b.spec.tls_name if enabled else b.spec.hostname)
            for n, b in zip(self.nodes, self.brokers, strict=True)
        )

    def _advertised_host(self, broker: BrokerProcess) -> str:
        try:
            out = broker.ctl(["eval", "rabbit_stream:host()."], timeout=15).strip()
            return out.strip('<>"')
        except TestBedError:
            return "?"

    def disable_lb_backend(self, node: str, listener: str | None = None) -> None:
        self.haproxy.disable_server(node, listener)

    def enable_lb_backend(self, node: str, listener: str | None = None) -> None:
        self.haproxy.enable_server(node, listener)

    def shutdown_lb_sessions(self, node: str, listener: str | None = None) -> None:
        self.haproxy.shutdown_sessions(node, listener)

    def restart_lb(self) -> None:
        """Stop HAProxy (every session through it drops) and start it again with the same listeners."""
        pid = self.haproxy.pid()
        self.haproxy.stop()
        if pid is not None:
            wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "HAProxy to stop", interval=0.05)
        self.haproxy.ensure()
        self._wait_lb_backends_up()

    def stop_dns(self) -> None:
        self.dns.stop()

    def start_dns(self) -> None:
        self.dns.start()

    def add_dns_record(self, name: str, type: str, value: str, ttl: int = 30) -> None:
        self.dns.add_record(name, type, value, ttl)

    def start_brokers(self, count: int) -> tuple[Node, ...]:
        """Start ``count`` independent single-node brokers (for federation); return them."""
        brokers = [self.broker(f"broker-{i}") for i in range(1, count + 1)]
        self._refuse_taken_ports(use for b in brokers for use in b.spec.port_uses())
        for b in brokers:
            b.start()
        for b in brokers:
            b.wait_ready()
        nodes = tuple(_node(b.spec) for b in brokers)
        for node in nodes:  # a management API that has just started answers 500 for a moment
            wait_until(functools.partial(self._api_answers, node.management_url), 60,
                       f"the management API of {node.name}", interval=0.25)
        return nodes

    def _api_answers(self, url: str) -> bool:
        from smartclient.management import ManagementClient

        try:
            with ManagementClient(url, self.username, self._password, timeout=5) as api:
                return bool(api.nodes())
        except ManagementError:
            return False

    def stop_brokers(self) -> None:
        for i in range(1, 7):
            b = self.broker(f"broker-{i}")
            if b.running():
                b.stop()

    def heal(self) -> None:
        self.heal_partitions()
        for b in self.brokers:
            if not b.running():
                b.start()
        for b in self.brokers:
            if b.running() and not b.listening():
                try:
                    b.ctl(["start_app"])
                except TestBedError as exc:  # still booting after a restart: wait below
                    log.info("start_app on %s: %s", b.spec.name, exc)
            b.wait_ready()
        wait_until(self.clustered, 60, "the cluster to heal", interval=0.5)
        self.haproxy.ensure()
        for protocol, balance in self.haproxy.listeners():
            for b in self.brokers:
                self.haproxy.set_ready(b.spec.name, f"{protocol}_{balance}")
        self._heal_locks()
        if not self.dns.running():
            self.dns.start()
        self.dns.reset_records()
        if any(n.advertised_host != b.spec.hostname for n, b in zip(self.nodes, self.brokers, strict=True)):
            self.advertise_hostnames(False)
        self._wait_lb_backends_up()


def _member(stream: str, vhost: str) -> str:
    """The Erlang expression for ``stream``'s member process on the node it is evaluated on."""
    return f'element(2, rabbit_stream_manager:lookup_local_member(<<"{vhost}">>, <<"{stream}">>))'
