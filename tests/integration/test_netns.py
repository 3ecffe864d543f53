"""The namespaced bed's network, for real (issue 55): namespaces, the lb-only fence, silent partitions, heal, and a
``down`` that leaves nothing behind.  No broker: an echo server in a node's namespace stands for one."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from smartclient import ConfigurationError
from smartclient.testing.netns import BedNetwork

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None,
                                reason="needs root, ip and nft (apt-get install -y nftables)")

PORT = 5999
ECHO = f"""
import socketserver
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(self.request.recv(100))
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer(("0.0.0.0", {PORT}), Echo).serve_forever()
"""


@pytest.fixture
def net() -> Iterator[BedNetwork]:
    network = BedNetwork(31000)
    network.down()  # (what a crashed run left)
    network.up()
    servers = [subprocess.Popen(["ip", "netns", "exec", network.namespace(i), sys.executable, "-c", ECHO])
               for i in range(1, network.nodes + 1)]
    try:
        yield network
    finally:
        network.down()
        for server in servers:
            server.wait(10)  # killed by down(): nothing in a namespace outlives it


def dial(address: str, source: str | None = None, timeout: float = 3.0, user_timeout_ms: int = 0) -> socket.socket:
    deadline = time.monotonic() + 5
    while True:
        sock = dial_socket(source, timeout, user_timeout_ms)
        try:
            sock.connect((address, PORT))
            return sock
        except ConnectionRefusedError:  # the echo server is still starting
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        except OSError:
            sock.close()
            raise


def dial_socket(source: str | None, timeout: float, user_timeout_ms: int) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    if user_timeout_ms:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, user_timeout_ms)
    if source is not None:
        sock.bind((source, 0))
    return sock


def echo(sock: socket.socket) -> bytes:
    with sock:
        sock.sendall(b"ping")
        return sock.recv(100)


def test_lb_only_lets_the_lb_in_and_tells_the_client_no_route_at_once(net: BedNetwork) -> None:
    assert echo(dial(net.address(1), source=net.lb_address)) == b"ping"
    began = time.monotonic()
    with pytest.raises(OSError) as refused:
        dial(net.address(1))
    assert refused.value.errno == errno.ENETUNREACH and time.monotonic() - began < 1.0
    net.set_fence(False)  # routable: the client dials the node too
    assert echo(dial(net.address(2))) == b"ping"


def test_a_partition_is_silent_and_heal_undoes_it(net: BedNetwork) -> None:
    quiet = dial(net.address(1), source=net.lb_address, user_timeout_ms=2000, timeout=10)
    net.apply(net.fault("isolate", 1))
    began = time.monotonic()
    with quiet, pytest.raises(OSError) as lost:
        quiet.sendall(b"ping")
        quiet.recv(100)
    waited = time.monotonic() - began
    # no reset, no FIN: only the client's own bound (TCP_USER_TIMEOUT) notices
    assert lost.value.errno == errno.ETIMEDOUT and 1.9 < waited < 4.0, (lost.value, waited)
    net.heal()
    assert echo(dial(net.address(1), source=net.lb_address)) == b"ping"


def test_a_node_cut_from_its_peers_still_answers_the_lb(net: BedNetwork) -> None:
    net.apply(net.fault("isolate-from-peers", 1))
    from_peer = subprocess.run(
        ["ip", "netns", "exec", net.namespace(2), sys.executable, "-c",
         f"import socket; socket.create_connection(('{net.address(1)}', {PORT}), timeout=1)"],
        capture_output=True, text=True, timeout=20, check=False)
    assert from_peer.returncode != 0 and "timed out" in from_peer.stderr
    assert echo(dial(net.address(1), source=net.lb_address)) == b"ping"
    net.apply(net.fault("cut-lb", 2))
    with pytest.raises(OSError):
        dial(net.address(2), source=net.lb_address, timeout=1.0)
    net.heal()
    assert echo(dial(net.address(2), source=net.lb_address)) == b"ping"


def test_down_leaves_nothing_and_can_run_again(net: BedNetwork) -> None:
    net.down()
    net.down()
    assert not any(ns.startswith(net.prefix) for ns in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())
    assert net.host_link not in subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert f"inet {net.prefix}" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                                                      check=True).stdout


def test_bad_input_is_named() -> None:
    with pytest.raises(ConfigurationError, match="port base"):
        BedNetwork(123)
    with pytest.raises(ConfigurationError, match="no partition 'flood'"):
        BedNetwork(31000).fault("flood")
    with pytest.raises(ConfigurationError, match="not a minority"):
        BedNetwork(31000).fault("split", minority=[1, 2])
