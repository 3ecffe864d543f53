"""The management client moves to the next node when one cannot be reached (real sockets on loopback)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from smartclient import ConfigurationError, ManagementError
from smartclient.management import ManagementClient


class _OverviewHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"rabbitmq_version": "4.3.6", "node": f"port-{self.server.server_port}"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def live() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OverviewHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed


def test_an_unreachable_node_is_skipped_and_the_one_that_answered_is_asked_first(live: str) -> None:
    dead = _closed_port()
    with ManagementClient([dead, live], "guest", "guest", timeout=2) as api:
        assert api.overview()["rabbitmq_version"] == "4.3.6"
        assert api.base_url == live
        assert api.overview()["node"].startswith("port-")  # straight to the live one


def test_no_node_reachable_is_a_management_error_naming_each(live: str) -> None:
    dead1, dead2 = _closed_port(), _closed_port()
    with ManagementClient([dead1, dead2], "guest", "guest", timeout=2) as api, \
            pytest.raises(ManagementError, match="no management node could be reached") as caught:
        api.overview()
    assert dead1 in str(caught.value) and dead2 in str(caught.value)


@pytest.mark.parametrize("urls", [[], ["ftp://x"], ["http://ok", "localhost:15672"]])
def test_bad_urls_are_refused(urls: list[str]) -> None:
    with pytest.raises(ConfigurationError):
        ManagementClient(urls, "guest", "guest")


def test_clients_never_load_the_ca_bundle_for_http_and_share_one_context_for_https(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx loads the whole CA bundle into a new context for each client (about 1 MB allocated in the calling
    thread, kept by its allocator arena): the soak's test bed, opening a client per request from worker threads,
    grew by megabytes that way."""
    import ssl

    from smartclient import management

    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args or kwargs)
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    monkeypatch.setattr(management, "_SHARED_TLS", None)
    for _ in range(3):
        ManagementClient("http://127.0.0.1:1", "guest", "guest").close()
    assert loads == []
    for _ in range(3):
        ManagementClient(["https://127.0.0.1:1", "http://127.0.0.1:2"], "guest", "guest").close()
    assert len(loads) == 1


def _proxy(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A proxy on loopback that hands each connection it takes to ``answer``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


@pytest.fixture
def hangs_up() -> Iterator[str]:
    """A proxy whose node is unreachable: it takes the request and closes without an answer."""

    def close(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.close()

    yield from _proxy(close)


def test_a_proxy_that_hangs_up_on_a_read_is_skipped(live: str, hangs_up: str) -> None:
    """CI, the namespaced bed: HAProxy's forward to a cut node's management API closed without an answer."""
    with ManagementClient([hangs_up, live], "guest", "guest", timeout=2) as api:
        assert api.overview()["rabbitmq_version"] == "4.3.6" and api.base_url == live


@pytest.fixture
def silent() -> Iterator[str]:
    """A proxy whose node went silent: it takes the request and never answers (the connection stays open)."""
    held: list[socket.socket] = []
    yield from _proxy(held.append)
    for conn in held:
        conn.close()


def test_a_node_that_does_not_answer_a_read_within_the_timeout_is_skipped(live: str, silent: str) -> None:
    """The partition run, the namespaced bed: a GET to a cut node's forward timed out reading (10 s), and the MQTT
    client placing itself gave up for good; a read is asked of the next node instead (a write still fails: it may
    have been taken)."""
    with ManagementClient([silent, live], "guest", "guest", timeout=1) as api:
        assert api.overview()["rabbitmq_version"] == "4.3.6" and api.base_url == live
    with ManagementClient([silent, live], "guest", "guest", timeout=1) as api, \
            pytest.raises(ManagementError, match="ReadTimeout"):
        api.put("/api/queues/%2F/q", {"durable": True})


@pytest.fixture
def stale_once() -> Iterator[str]:
    """A node whose first connection is a kept-alive one it closed while the FIN was lost (a partition healed since):
    the request is taken and the connection closed without an answer; a new connection is answered."""
    seen: list[int] = []

    def answer(conn: socket.socket) -> None:
        conn.recv(65536)
        if not seen:
            seen.append(1)
        else:
            conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()

    yield from _proxy(answer)


def test_an_idempotent_write_is_sent_again_once_on_a_new_connection(stale_once: str) -> None:
    """CI, the namespaced bed, after a cut-lb healed: a queue's DELETE through the pooled connection to that node's
    management API got "Server disconnected without sending a response"."""
    with ManagementClient([stale_once], "guest", "guest", timeout=2) as api:
        api.delete("/api/queues/%2F/q")


def test_a_write_that_is_not_idempotent_is_not_sent_again(hangs_up: str) -> None:
    with ManagementClient([hangs_up], "guest", "guest", timeout=2) as api, \
            pytest.raises(ManagementError, match=r"POST .* failed: (RemoteProtocolError|ReadError)"):
        # (closed with the body unread, the proxy's socket resets: py3.10 in CI once read the reset first)
        api.post("/api/definitions", {})
