"""The management client moves to the next node when one cannot be reached (real sockets on loopback)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from smartclient import ConfigurationError, ManagementError
from smartclient.management import ManagementClient


class _Overview(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
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
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Overview)
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
