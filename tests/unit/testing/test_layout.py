"""The test bed's port plan and rendered configs: pure, no broker."""

from pathlib import Path

import pytest

from smartclient import ConfigurationError
from smartclient.testing.broker import render_rabbitmq_conf
from smartclient.testing.layout import Layout
from smartclient.testing.loadbalancer import render_haproxy_config


def test_ports_follow_base_slot_offset() -> None:
    layout = Layout(base=35000)
    r2 = layout.nodes[1]
    assert [n.name for n in layout.nodes] == ["rabbit-1@localhost", "rabbit-2@localhost", "rabbit-3@localhost"]
    assert (r2.stream_port, r2.amqp_port, r2.mqtt_port, r2.management_port, r2.dist_port) == (
        35252, 35272, 35283, 35215, 35225)
    assert layout.lb_port("stream") == 35052
    assert layout.lb_port("amqp", "source") == 37172
    assert layout.dns_port == 35053


def test_every_port_is_distinct() -> None:
    layout = Layout(base=40000)
    ports = [layout.epmd_port, layout.dns_port]
    for spec in [*layout.nodes, *(layout.extra_broker(i) for i in range(1, 7))]:
        ports += [spec.port(p) for p in ("stream", "stream_tls", "amqp", "mqtt", "management", "dist")]
    for balance in ("roundrobin", "random", "source"):
        ports += [layout.lb_port(p, balance) for p in ("stream", "amqp", "mqtt")]
    assert len(ports) == len(set(ports))
    assert max(ports) < 65536


@pytest.mark.parametrize("env, message", [
    ({"SMARTCLIENT_TESTBED_PORT_BASE": "abc"}, "not a whole number"),
    ({"SMARTCLIENT_TESTBED_PORT_BASE": "80"}, "out of range"),
    ({"SMARTCLIENT_TESTBED_PORT_BASE": "65000"}, "out of range"),
])
def test_bad_port_base_is_a_configuration_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Layout.from_env(env)


def test_env_moves_base_and_cache() -> None:
    layout = Layout.from_env({"SMARTCLIENT_TESTBED_PORT_BASE": "41000", "SMARTCLIENT_TESTBED_CACHE": "/tmp/x"})
    assert layout.base == 41000
    assert layout.chroot == Path("/tmp/x/rabbitmq-4.3-forky")  # 4.3 is the default line
    assert str(layout.run_dir).endswith("srv/smartclient-testbed/41000")


def test_env_picks_the_rabbitmq_line_and_its_own_port_base() -> None:
    assert Layout.from_env({}).base == 20000
    old = Layout.from_env({"SMARTCLIENT_TESTBED_RABBITMQ": "4.0"})
    assert (old.release.suite, old.base, old.chroot.name) == ("trixie", 23000, "rabbitmq-4.0-trixie")
    assert Layout.from_env({"SMARTCLIENT_TESTBED_RABBITMQ": "4.3.6"}).release.suite == "forky"
    assert Layout.from_env({"SMARTCLIENT_TESTBED_RABBITMQ": "4.0", "SMARTCLIENT_TESTBED_PORT_BASE": "30000"}).base == 30000
    # the two default beds do not share a port
    assert not Layout(base=20000).overlaps(23000, 23000 + 2299)
    with pytest.raises(ConfigurationError, match=r"'3.13' is not a line the test bed provisions; use one of 4.3, 4.0"):
        Layout.from_env({"SMARTCLIENT_TESTBED_RABBITMQ": "3.13"})


def test_node_lookup_by_short_or_full_name() -> None:
    layout = Layout()
    assert layout.node("rabbit-3").name == "rabbit-3@localhost"
    assert layout.node("broker-2@localhost").clustered is False
    with pytest.raises(ConfigurationError, match="unknown test-bed node 'rabbit-9'"):
        layout.node("rabbit-9")
    with pytest.raises(ConfigurationError, match="out of range"):
        layout.extra_broker(7)


def test_lb_port_rejects_unknown_protocol_and_balance() -> None:
    with pytest.raises(ConfigurationError, match="protocol 'stomp'"):
        Layout().lb_port("stomp")
    with pytest.raises(ConfigurationError, match="balance 'leastconn'"):
        Layout().lb_port("stream", "leastconn")


def test_rabbitmq_conf_binds_every_listener_to_loopback() -> None:
    spec = Layout().nodes[0]
    conf = render_rabbitmq_conf(spec, ["stream.advertised_host = rabbit-1.smartclient.test"])
    assert f"listeners.tcp.default = 127.0.0.1:{spec.amqp_port}" in conf
    assert f"stream.listeners.tcp.default = 127.0.0.1:{spec.stream_port}" in conf
    assert f"mqtt.listeners.tcp.default = 127.0.0.1:{spec.mqtt_port}" in conf
    assert "management.tcp.ip = 127.0.0.1" in conf
    assert conf.rstrip().endswith("stream.advertised_host = rabbit-1.smartclient.test")


def test_haproxy_config_has_one_listener_per_protocol_and_balance() -> None:
    layout = Layout()
    cfg = render_haproxy_config(layout, layout.nodes, [("stream", "roundrobin"), ("stream", "source")],
                                Path("/x/admin.sock"), maxconn=1234)
    assert "listen stream_roundrobin" in cfg and "listen stream_source" in cfg
    assert "bind 127.0.0.1:20052" in cfg and "balance source" in cfg
    assert cfg.count("server rabbit-2 127.0.0.1:20252 check") == 2
    assert "stats socket /x/admin.sock mode 600 level admin" in cfg
    assert "maxconn 1234" in cfg and "nbthread 1" in cfg


def test_random1_is_haproxy_random_with_one_draw() -> None:
    layout = Layout()
    cfg = render_haproxy_config(layout, layout.nodes, [("mqtt", "random1")], Path("/x/admin.sock"), maxconn=10)
    assert "listen mqtt_random1" in cfg and "balance random(1)" in cfg
    assert f"bind 127.0.0.1:{layout.lb_port('mqtt', 'random1')}" in cfg
    assert layout.lb_port("mqtt", "random1") < layout.base + 2300
