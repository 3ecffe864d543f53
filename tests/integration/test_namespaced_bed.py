"""The namespaced test bed (issue 55), for real: three RabbitMQ nodes, each in a network namespace of its own on
its own address, which the client cannot reach; HAProxy (dialling from the one address the fence lets through) is
the only way in.  The seed's scenario: the quickstart places its producer on the leader and its consumers on
replicas through the load balancer alone."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from smartclient.testing.local import LocalTestBed

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
                                reason="needs root, ip and nft (apt-get install -y nftables)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def namespaced_bed(rabbitmq_namespaced_testbed: LocalTestBed) -> LocalTestBed:
    return rabbitmq_namespaced_testbed


def test_the_nodes_run_in_their_namespaces_and_the_client_cannot_dial_them(namespaced_bed: LocalTestBed) -> None:
    bed = namespaced_bed
    net = bed.layout.bed_network
    assert [(n.name, n.host, n.advertised_host) for n in bed.nodes] == [
        (f"rabbit-{i}@{net.namespace(i)}", net.address(i), net.namespace(i)) for i in (1, 2, 3)]
    assert bed.clustered()
    for node in bed.nodes:
        with socket.socket() as sock, pytest.raises(OSError) as refused:
            sock.settimeout(3)
            sock.connect((node.host, node.stream_port))
        assert refused.value.errno == errno.ENETUNREACH  # the fence: at once, not a timeout
    with bed.management() as api:  # each node's management API, forwarded on 127.0.0.1
        assert {n["name"] for n in api.nodes() if n["running"]} == {n.name for n in bed.nodes}
    assert f"network namespaces {net.subnet}.0/24, lb-only" in bed.status()["kind"]


def test_the_quickstart_places_through_the_load_balancer_alone(namespaced_bed: LocalTestBed) -> None:
    host, port = namespaced_bed.lb("stream")
    run = subprocess.run([sys.executable, str(ROOT / "examples/quickstart.py")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "SMARTCLIENT_URI": f"rabbitmq-stream://guest:guest@{host}:{port}/"})
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "placement OK" in run.stdout
    net = namespaced_bed.layout.bed_network
    assert all(f"{net.namespace(i)}:" in run.stdout for i in (1, 2, 3))  # each node reported by its own name


def test_down_leaves_nothing_behind_and_up_comes_back(namespaced_bed: LocalTestBed) -> None:
    bed = namespaced_bed
    net = bed.layout.bed_network
    bed.down()
    assert not net.exists() and not bed.haproxy.running() and not bed.dns.running()
    assert all(b.pid() is None for b in bed.brokers)
    assert net.prefix not in Path("/etc/hosts").read_text()
    assert net.prefix not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    bed.up()  # from the nodes' data: the same cluster again (and the session's bed up again)
    assert bed.clustered()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_namespaced_bed_where_namespaces_cannot_be_made_says_so_in_one_typed_line_and_leaves_nothing(
        rabbitmq_namespaced_testbed: LocalTestBed) -> None:
    """A user namespace is root without the right to mount /run/netns (a container without CAP_SYS_ADMIN): the
    bed's first ``ip netns add`` fails there, for real.  (The fixture only makes sure the chroot is provisioned.)"""
    base = 14000  # clear of every other bed (each spans 2,400 ports): 8000, 11000, 17000, 20000, 23000
    before = (_netns(), _links())
    run = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-m", "smartclient.testing", "up",
                          "--network", "namespaces"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SMARTCLIENT_TESTBED_PORT_BASE": str(base)})
    print(run.stderr)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "smartclient test bed: PrerequisiteMissing: network namespaces cannot be made here:"), lines
    assert (_netns(), _links()) == before  # nothing made, nothing taken
    assert "sc140" not in " ".join(_netns() | _links())


def _netns() -> set[str]:
    return {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                       check=True).stdout.splitlines() if line.strip()}


def _links() -> set[str]:
    return {line.split(":")[1].strip().split("@")[0] for line in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines()}
