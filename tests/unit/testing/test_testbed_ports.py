"""Which ports a test bed needs, and which of them a process other than its own holds (pure: no /proc read, except
the last test, which reads this process's own socket)."""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

import pytest

from smartclient import PrerequisiteMissing
from smartclient.testing.layout import PORT_SPAN, RELEASES, Layout, PortUse
from smartclient.testing.ports import (
    BedIdentity,
    ProcessInfo,
    SocketRow,
    TakenPort,
    find_taken_ports,
    parse_socket_table,
    refusal,
    taken_ports,
)

LAYOUT = Layout(base=20000, cache_dir=Path("/var/cache/smartclient"))
ME = BedIdentity.of(LAYOUT)
RUN = str(LAYOUT.run_dir)
CHROOT = os.path.realpath(LAYOUT.chroot)

HAPROXY = ProcessInfo(24875, ("haproxy", "-f", f"{RUN}/haproxy/haproxy.cfg", "-D", "-p", f"{RUN}/haproxy/haproxy.pid"),
                      "/", frozenset({"HOME=/root"}))
DNS = ProcessInfo(9186, ("/venv/bin/python", "-m", "smartclient.testing.dns_server", "--port", "20053",
                         "--zone", f"{RUN}/dns/zone.json", "--pidfile", f"{RUN}/dns/dns.pid"), "/")
BEAM = ProcessInfo(8801, ("/usr/lib/erlang/erts-17.1/bin/beam.smp", "-W", "w"), CHROOT,
                   frozenset({"ERL_EPMD_PORT=20043", "RABBITMQ_NODENAME=rabbit-1@localhost",
                              "HOME=/srv/smartclient-testbed/20000"}))
EPMD = ProcessInfo(8890, ("/usr/lib/erlang/erts-17.1/bin/epmd", "-daemon"), CHROOT, frozenset({"ERL_EPMD_PORT=20043"}))


def test_a_bed_lists_every_port_it_may_listen_on_in_its_span() -> None:
    uses = LAYOUT.port_uses()
    tcp = [u.port for u in uses if u.transport == "tcp"]
    assert len(tcp) == len(set(tcp))  # no port wanted twice
    assert all(LAYOUT.base <= u.port < LAYOUT.base + PORT_SPAN for u in uses)
    assert list(uses) == sorted(uses)
    by_port = {(u.transport, u.port): u.what for u in uses}
    assert by_port[("tcp", 22351)] == "the stream_tls SNI frontend"
    assert by_port[("tcp", 22183)] == "the mqtt_source LB listener"
    assert by_port[("tcp", 21183)] == "the mqtt port of broker-1@localhost"  # started on demand: wanted too
    assert by_port[("tcp", 20125)] == "the dist port of rabbit-1@localhost"
    assert by_port[("tcp", 20043)] == "the nodes' epmd"
    assert by_port[("udp", 20053)] == by_port[("tcp", 20053)] == "the DNS server"
    # 3 nodes and 6 extra brokers of 8 ports, 4 balances of 5 LB listeners, 3 SNI frontends, epmd, DNS (TCP, UDP)
    assert len(uses) == 9 * 8 + 4 * 5 + 3 + 1 + 2


def test_the_default_bases_are_a_span_apart() -> None:
    bases = sorted(r.default_base for r in RELEASES.values())
    assert all(b - a >= PORT_SPAN for a, b in itertools.pairwise(bases))
    ports_43 = {u.port for u in Layout(base=RELEASES["4.3"].default_base).port_uses()}
    ports_40 = {u.port for u in Layout(base=RELEASES["4.0"].default_base).port_uses()}
    assert not ports_43 & ports_40
    # bases 1,000 apart (the issue's two beds) share ports: the 20000 bed's SNI frontends are 21000's broker-3
    assert {u.port for u in Layout(base=21000).port_uses()} & ports_43 >= {22351, 22371, 22382}


def test_the_socket_table_gives_port_state_and_inode() -> None:
    table = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:574F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 61234 1 0 100 0 0 10 0
   1: 0100007F:574F 0100007F:D3A2 01 00000000:00000000 00:00000000 00000000     0        0 61299 1 0 20 4 30 10 -1
   2: 00000000:4E7D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51000 1 0 100 0 0 10 0
"""
    assert parse_socket_table(table) == [SocketRow(0x574F, 0x0A, 61234), SocketRow(0x574F, 0x01, 61299),
                                         SocketRow(0x4E7D, 0x0A, 51000)]
    v6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:4E4B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7001 1 0 100 0 0 10 0
"""  # noqa: E501
    assert parse_socket_table(v6) == [SocketRow(20043, 0x0A, 7001)]


def test_what_the_bed_itself_runs_is_its_own() -> None:
    assert all(ME.owns(p) for p in (HAPROXY, DNS, BEAM, EPMD))


def test_another_bed_or_anything_else_is_foreign() -> None:
    other_base = BedIdentity.of(Layout(base=2000, cache_dir=Path("/var/cache/smartclient")))
    assert not any(other_base.owns(p) for p in (HAPROXY, DNS, BEAM, EPMD))  # .../2000 is no prefix of .../20000/
    other_release = BedIdentity.of(Layout(base=20000, cache_dir=Path("/var/cache/smartclient"),
                                          release=RELEASES["4.0"]))
    assert not any(other_release.owns(p) for p in (HAPROXY, DNS, BEAM, EPMD))  # same base, another chroot
    assert not ME.owns(ProcessInfo(1, ("python", "-c", "hold a port"), "/", frozenset({"ERL_EPMD_PORT=20043"})))
    assert not ME.owns(ProcessInfo(2, ("beam.smp",), CHROOT, frozenset({"ERL_EPMD_PORT=23043"})))
    assert not ME.owns(ProcessInfo(3, ("epmd",), None, frozenset({"ERL_EPMD_PORT=20043"})))  # root unreadable


def test_a_port_held_by_the_bed_itself_is_not_taken_one_held_by_another_is() -> None:
    sni = PortUse(22351, "tcp", "the stream_tls SNI frontend")
    dns = PortUse(20053, "udp", "the DNS server")
    epmd = PortUse(20043, "tcp", "the nodes' epmd")
    stranger = ProcessInfo(4242, ("python3", "-m", "http.server", "22351"), "/")
    blocking = {("tcp", 22351): {11}, ("udp", 20053): {12}, ("tcp", 20043): {13, 14}}
    # a running bed: every socket is its own (epmd's on 0.0.0.0 and on ::)
    own = {11: [HAPROXY], 12: [DNS], 13: [EPMD], 14: [EPMD]}
    assert taken_ports([sni, dns, epmd], blocking, own, ME) == []
    # the same ports held by another bed's HAProxy, an unknown holder, a stranger beside the bed's own epmd
    other = ProcessInfo(777, ("haproxy", "-f", "/var/cache/smartclient/rabbitmq-4.3-forky/srv/smartclient-testbed/"
                                                "19000/haproxy/haproxy.cfg"), "/")
    taken = taken_ports([sni, dns, epmd], blocking, {11: [other], 13: [EPMD], 14: [stranger]}, ME)
    assert taken == [TakenPort(epmd, stranger), TakenPort(dns, None), TakenPort(sni, other)]  # in port order
    assert taken_ports([sni], {}, {}, ME) == []  # nothing holds it


def test_the_refusal_is_one_line_naming_port_use_pid_and_command() -> None:
    holder = ProcessInfo(777, ("haproxy", "-f", "/x/19000/haproxy/haproxy.cfg"), "/")
    taken = [TakenPort(PortUse(22351, "tcp", "the stream_tls SNI frontend"), holder),
             TakenPort(PortUse(22371, "tcp", "the amqp_tls SNI frontend"), holder),
             TakenPort(PortUse(20053, "udp", "the DNS server"), None)]
    message = refusal(taken, 21000)
    assert "\n" not in message
    assert message.startswith("the test bed on port base 21000 cannot start: port 22351 (the stream_tls SNI frontend)"
                              " is taken by pid 777 (haproxy -f /x/19000/haproxy/haproxy.cfg)")
    assert "2 more of its ports are taken too (22371, 20053)" in message
    assert "SMARTCLIENT_TESTBED_PORT_BASE (now 21000)" in message and "at least 2400 apart" in message
    assert "port 20053/udp (the DNS server) is taken by an unknown process. Free it" in refusal(taken[2:], 20000)
    beam = TakenPort(PortUse(20152, "tcp", "the stream port of rabbit-1@localhost"), BEAM)
    assert "pid 8801 (/usr/lib/erlang/erts-17.1/bin/beam.smp -W w; started for RabbitMQ node rabbit-1@localhost, " \
           "HOME /srv/smartclient-testbed/20000)" in refusal([beam], 18000)
    long = ProcessInfo(5, tuple(["x" * 50] * 10))
    assert len(long.command) == 200 and long.command.endswith("...")


def test_proc_names_this_process_as_the_holder_of_a_socket_it_listens_on() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        use = PortUse(port, "tcp", "a port")
        [taken] = find_taken_ports([use], ME)
        assert taken.use == use and taken.holder is not None and taken.holder.pid == os.getpid()
    assert find_taken_ports([use], ME) == []  # closed: free again


def test_extra_brokers_started_later_refuse_at_once_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The issue's bed waited 90 s on broker-1, started on demand after up(): start_brokers() checks first."""
    from smartclient.testing.broker import BrokerProcess
    from smartclient.testing.local import LocalTestBed

    started: list[str] = []
    monkeypatch.setattr(BrokerProcess, "start", lambda self: started.append(self.spec.name))
    bed = LocalTestBed(Layout(base=25000, cache_dir=tmp_path))
    port = bed.layout.extra_broker(2).mqtt_port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        with pytest.raises(PrerequisiteMissing, match=rf"port {port} \(the mqtt port of broker-2@localhost\) is "
                                                      rf"taken by pid {os.getpid()} "):
            bed.start_brokers(2)
    assert started == []
