"""Two test beds side by side (issue 53, item 7): a bed whose ports another process holds refuses at once, naming
the port, what it wanted it for and the process holding it; the running bed's own processes are its own."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator

import pytest

from smartclient import FaultUnavailable, PrerequisiteMissing
from smartclient.testing import TestBed
from smartclient.testing.layout import Layout
from smartclient.testing.local import LocalTestBed
from smartclient.testing.ports import BedIdentity, find_taken_ports

#: far from both default beds (20000-22399, 23000-25399) and from the Spark cluster (27000-27099)
NEW_BASE = 28000
#: an identity nothing has: every process holding a port is foreign to it
NOBODY = BedIdentity("/nonexistent/bed", "/nonexistent/chroot", 0)


def _local(bed: TestBed) -> LocalTestBed:
    if not isinstance(bed, LocalTestBed):
        raise FaultUnavailable("the port check belongs to the local test bed")
    return bed


@pytest.fixture
def new_bed(rabbitmq_testbed: TestBed) -> Iterator[LocalTestBed]:
    """A second bed of the running bed's release at port base 28000: described, never brought up here."""
    running = _local(rabbitmq_testbed)
    layout = Layout(base=NEW_BASE, cache_dir=running.layout.cache_dir, release=running.layout.release)
    run_dir_existed = layout.run_dir.exists()
    bed = LocalTestBed(layout)
    yield bed
    if not run_dir_existed:
        assert not layout.run_dir.exists(), "the refused bed created its run directory"


def _hold(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.mark.parametrize("which", ["the stream_tls SNI frontend", "the mqtt port of broker-1@localhost"])
def test_a_bed_whose_port_is_held_refuses_at_once_naming_the_port_and_its_holder(
        new_bed: LocalTestBed, which: str) -> None:
    [use] = [u for u in new_bed.layout.port_uses() if u.what == which and u.transport == "tcp"]
    assert find_taken_ports(new_bed.layout.port_uses(), NOBODY) == [], f"something holds a port of base {NEW_BASE}"
    with _hold(use.port):
        started = time.monotonic()
        with pytest.raises(PrerequisiteMissing) as info:
            new_bed.up()
        took = time.monotonic() - started
        # nothing of the new bed was started: the held port is the only one of its ports anything listens on
        assert [t.use.port for t in find_taken_ports(new_bed.layout.port_uses(), NOBODY)] == [use.port]
    message = str(info.value)
    assert took < 2.0, f"the refusal took {took:.1f} s"
    assert "\n" not in message
    assert f"port {use.port} ({which}) is taken by pid {os.getpid()} (" in message, message
    assert f"SMARTCLIENT_TESTBED_PORT_BASE (now {NEW_BASE})" in message


def test_a_bed_1000_ports_above_the_running_one_refuses_naming_its_haproxy(rabbitmq_testbed: TestBed) -> None:
    """The issue's two beds: the running bed's SNI frontends (base + 2351...) are the second bed's broker-3. Only the
    check is called, not up(): a second bed overlapping the running one must never start, even if the check
    failed."""
    running = _local(rabbitmq_testbed)
    layout = Layout(base=running.layout.base + 1000, cache_dir=running.layout.cache_dir,
                    release=running.layout.release)
    started = time.monotonic()
    with pytest.raises(PrerequisiteMissing) as info:
        LocalTestBed(layout).check_prerequisites()
    assert time.monotonic() - started < 2.0
    haproxy = running.haproxy.pid()
    assert haproxy is not None
    message = str(info.value)
    assert f"is taken by pid {haproxy} (haproxy -f {running.haproxy.config_file}" in message, message
    named = re.search(rf"the test bed on port base {layout.base} cannot start: port (\d+) ", message)
    assert named is not None, message
    haproxy_ports = {t.use.port for t in find_taken_ports(running.layout.port_uses(), NOBODY)
                     if t.holder is not None and t.holder.pid == haproxy}
    assert int(named.group(1)) in haproxy_ports


def test_the_running_bed_holds_its_ports_itself_and_checks_them_quickly(rabbitmq_testbed: TestBed) -> None:
    running = _local(rabbitmq_testbed)
    uses = running.layout.port_uses()
    held = {t.use.port for t in find_taken_ports(uses, NOBODY)}
    sni = {running.layout.sni_port(p) for p in ("stream_tls", "amqp_tls", "mqtt_tls")}
    assert sni | {n.stream_port for n in running.layout.nodes} | {running.layout.epmd_port} <= held  # it sees them
    assert find_taken_ports(uses, BedIdentity.of(running.layout)) == []  # and they are all the bed's own
    started = time.monotonic()
    running.check_prerequisites()
    assert time.monotonic() - started < 2.0
