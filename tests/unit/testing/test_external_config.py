"""Attaching the fixtures to a cluster described by SMARTCLIENT_TESTBED_EXTERNAL."""

import json
from pathlib import Path

import pytest

from smartclient import ConfigurationError, FaultUnavailable
from smartclient.testing import from_env
from smartclient.testing.external import ExternalTestBed
from smartclient.testing.local import LocalTestBed

CONFIG = {
    "username": "svc", "password_env": "SC_TEST_PW",
    "nodes": [{"name": "rabbit@a", "host": "10.9.0.1", "advertised_host": "a"},
              {"host": "10.9.0.2", "stream_port": 6552}],
    "lb": {"host": "lb.example", "stream_port": 5551},
    "dns": {"host": "127.0.0.1", "port": 5353},
}


def test_from_file_with_password_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "bed.json"
    path.write_text(json.dumps(CONFIG))
    monkeypatch.setenv("SC_TEST_PW", "s3cret-value")
    bed = from_env({"SMARTCLIENT_TESTBED_EXTERNAL": str(path)})
    assert isinstance(bed, ExternalTestBed)
    a, b = bed.nodes
    assert (a.name, a.advertised, a.amqp_port, a.management_port) == ("rabbit@a", ("a", 5552), 5672, 15672)
    assert (b.name, b.advertised) == ("rabbit@10.9.0.2", ("10.9.0.2", 6552))
    assert bed.lb("stream") == ("lb.example", 5551)
    assert bed.dns_address == ("127.0.0.1", 5353)
    assert "s3cret-value" not in repr(bed)
    with pytest.raises(FaultUnavailable, match="no random load balancer"):
        bed.lb("stream", "random")
    with pytest.raises(FaultUnavailable, match="no roundrobin load balancer for amqp"):
        bed.lb("amqp")


def test_local_is_the_default() -> None:
    assert isinstance(from_env({}), LocalTestBed)


@pytest.mark.parametrize("value, message", [
    ("{not json", "not valid JSON"),
    ('{"nodes": []}', "non-empty 'nodes'"),
    ('{"nodes": [{"port": 1}]}', r"nodes\[0\] has no 'host'"),
    ('{"nodes": [{"host": "h"}], "password_env": "SC_SURELY_UNSET"}', "SC_SURELY_UNSET"),
    ("/nonexistent/bed.json", "cannot be read"),
])
def test_bad_external_config(value: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ExternalTestBed.from_config(value)
