"""Start, stop and feed the test bed's DNS server (see :mod:`smartclient.testing.dns_server`).

Default zone ``smartclient.test``:

* ``rabbit-N.smartclient.test``, ``broker-N.smartclient.test`` and ``lb.smartclient.test``: A 127.0.0.1 (a
  namespaced node's: its own address);
* ``_rabbitmq-stream._tcp``, ``_amqp._tcp`` and ``_mqtt._tcp`` under ``smartclient.test``: SRV to each node;
* the same three under ``lb.smartclient.test``: SRV to the round-robin LB listener.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from smartclient.testing.dns_server import DnsRecord, ZoneFile
from smartclient.testing.layout import BrokerSpec, Layout
from smartclient.testing.processes import kill_pid, pid_alive, read_pid, wait_until

__all__ = ["SRV_SERVICES", "ZONE", "DnsServer", "default_records"]

ZONE = "smartclient.test"
#: protocol -> SRV service label
SRV_SERVICES = {"stream": "_rabbitmq-stream._tcp", "amqp": "_amqp._tcp", "mqtt": "_mqtt._tcp"}


def default_records(layout: Layout, nodes: Iterable[BrokerSpec], ttl: int = 30) -> list[DnsRecord]:
    nodes = list(nodes)
    records = [DnsRecord(f"{n.short}.{ZONE}", "A", n.host, ttl) for n in nodes]
    records.append(DnsRecord(f"lb.{ZONE}", "A", "127.0.0.1", ttl))
    for protocol, service in SRV_SERVICES.items():
        records += [
            DnsRecord(f"{service}.{ZONE}", "SRV", f"0 10 {n.port(protocol)} {n.short}.{ZONE}.", ttl)
            for n in nodes
            if n.clustered
        ]
        records.append(
            DnsRecord(f"{service}.lb.{ZONE}", "SRV", f"0 10 {layout.lb_port(protocol)} lb.{ZONE}.", ttl)
        )
    return [r.normalised() for r in records]


class DnsServer:
    """The DNS server process on ``127.0.0.1:<layout.dns_port>`` (UDP and TCP)."""

    def __init__(self, layout: Layout, nodes: Iterable[BrokerSpec]) -> None:
        self.layout = layout
        self.nodes = list(nodes)
        self.dir = layout.run_dir / "dns"
        self.zone = ZoneFile(self.dir / "zone.json")

    @property
    def port(self) -> int:
        return self.layout.dns_port

    @property
    def pid_file(self) -> Path:
        return self.dir / "dns.pid"

    def pid(self) -> int | None:
        pid = read_pid(self.pid_file)
        return pid if pid_alive(pid, must_contain="smartclient.testing.dns_server") else None

    def running(self) -> bool:
        return self.pid() is not None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.zone.path.exists():
            self.reset_records()
        if self.running():
            return
        log = (self.dir / "dns.log").open("ab")
        with log:
            subprocess.Popen(
                [sys.executable, "-m", "smartclient.testing.dns_server", "--port", str(self.port),
                 "--zone", str(self.zone.path), "--pidfile", str(self.pid_file)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        wait_until(self._answers, 15, f"the DNS server on 127.0.0.1:{self.port}")

    def _answers(self) -> bool:
        import socket

        from dnslib import DNSRecord

        query = DNSRecord.question(f"lb.{ZONE}").pack()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.3)
            sock.sendto(query, ("127.0.0.1", self.port))
            return bool(sock.recv(4096))

    def stop(self) -> None:
        """Stop the server at once (SIGKILL): an outage, not a polite shutdown."""
        pid = self.pid()
        if pid is not None:
            kill_pid(pid)

    def reset_records(self) -> None:
        self.zone.write(default_records(self.layout, self.nodes))

    def add_record(self, name: str, type: str, value: str, ttl: int = 30) -> DnsRecord:
        """Add a record (A, AAAA, SRV, or DROP to make the server ignore that name); live at once."""
        record = DnsRecord(name, type, value, ttl).normalised()
        self.zone.add(record)
        return record

    def remove_record(self, name: str, type: str | None = None) -> None:
        self.zone.remove(name, type)

    def records(self) -> list[DnsRecord]:
        return self.zone.read()
