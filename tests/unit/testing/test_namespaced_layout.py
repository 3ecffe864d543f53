"""The namespaced bed as data: names, addresses, configs and the hosts block (no root, nothing started)."""

from pathlib import Path

import pytest

from smartclient import ConfigurationError
from smartclient.testing.broker import render_rabbitmq_conf
from smartclient.testing.layout import Layout
from smartclient.testing.loadbalancer import render_haproxy_config
from smartclient.testing.local import _node
from smartclient.testing.nameserver import default_records
from smartclient.testing.netns import BedNetwork, parse_listening

NS = Layout(base=20000, network="namespaces")


def test_the_network_comes_from_the_environment_and_loopback_stays_the_default() -> None:
    assert Layout.from_env({}).network == "loopback"
    assert Layout.from_env({"SMARTCLIENT_TESTBED_NETWORK": "namespaces"}).namespaced
    with pytest.raises(ConfigurationError, match=r"SMARTCLIENT_TESTBED_NETWORK='vlan' is not a test-bed network; "
                                                 r"use one of loopback, namespaces"):
        Layout.from_env({"SMARTCLIENT_TESTBED_NETWORK": "vlan"})
    with pytest.raises(ConfigurationError, match="multiple of 100"):
        Layout(base=20050, network="namespaces")


def test_each_node_has_its_namespace_address_and_host_name_and_its_data_lives_apart() -> None:
    names = [(s.name, s.host, s.netns) for s in NS.nodes]
    assert names == [("rabbit-1@sc200-n1", "10.231.200.11", "sc200-n1"),
                     ("rabbit-2@sc200-n2", "10.231.200.12", "sc200-n2"),
                     ("rabbit-3@sc200-n3", "10.231.200.13", "sc200-n3")]
    assert [s.stream_port for s in NS.nodes] == [s.stream_port for s in Layout().nodes]  # the same ports
    assert NS.run_dir.name == "20000-ns" and Layout().run_dir.name == "20000"
    assert NS.node("rabbit-2").hostname == "sc200-n2" and NS.node("rabbit-2@sc200-n2").slot == 2
    assert Layout().nodes[0].hostname == "localhost" and Layout().nodes[0].netns == ""


def test_a_namespaced_node_listens_on_its_address_and_advertises_its_host_name() -> None:
    spec = NS.nodes[1]
    conf = render_rabbitmq_conf(spec)
    assert f"stream.listeners.tcp.default = 10.231.200.12:{spec.stream_port}" in conf
    assert f"listeners.tcp.default = 10.231.200.12:{spec.amqp_port}" in conf
    assert "management.tcp.ip = 10.231.200.12" in conf
    assert "stream.advertised_host = sc200-n2" in conf
    assert "advertised_host" not in render_rabbitmq_conf(Layout().nodes[1])


def test_haproxy_dials_the_nodes_from_the_lb_address_and_forwards_each_management_api_and_stream_port() -> None:
    cfg = render_haproxy_config(NS, NS.nodes, [("stream", "roundrobin")], Path("/x/admin.sock"))
    assert "server rabbit-2 10.231.200.12:20252 check inter 1s fall 2 rise 2 source 10.231.200.2" in cfg
    assert "listen forward_management_rabbit-3\n    bind 127.0.0.1:20315\n" in cfg
    assert "server rabbit-3 10.231.200.13:20315 check inter 1s fall 2 rise 2 source 10.231.200.2" in cfg
    assert "listen forward_stream_rabbit-3\n    bind 127.0.0.1:20352\n" in cfg  # the test bed's probes' way in
    assert "server rabbit-3 10.231.200.13:20352 check inter 1s fall 2 rise 2 source 10.231.200.2" in cfg
    loopback = render_haproxy_config(Layout(), Layout().nodes, [("stream", "roundrobin")], Path("/x/admin.sock"))
    assert "source" not in loopback and "forward_" not in loopback


def test_clients_see_a_namespaced_node_on_its_address_and_its_management_api_on_loopback() -> None:
    node = _node(NS.nodes[0])
    assert (node.host, node.advertised, node.management_url) == (
        "10.231.200.11", ("sc200-n1", 20152), "http://127.0.0.1:20115")
    assert _node(Layout().nodes[0]).management_url == "http://127.0.0.1:20115"
    records = {r.name: r.value for r in default_records(NS, NS.nodes) if r.type == "A"}
    assert records[next(name for name in records if name.startswith("rabbit-1."))] == "10.231.200.11"


def test_the_hosts_block_is_added_once_and_removed_whole(tmp_path: Path) -> None:
    net = BedNetwork(20000)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost")
    net.write_hosts(True, str(hosts))
    net.write_hosts(True, str(hosts))
    text = hosts.read_text()
    assert text.count("10.231.200.12 sc200-n2\n") == 1 and text.startswith("127.0.0.1 localhost\n::1 localhost\n")
    BedNetwork(20100).write_hosts(True, str(hosts))  # another bed's block stays when this one goes
    net.write_hosts(False, str(hosts))
    assert "sc200" not in hosts.read_text() and "10.231.201.11 sc201-n1" in hosts.read_text()


def test_listening_ports_are_read_from_a_proc_net_tcp_table() -> None:
    table = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
             "   0: 0B00E70A:4F20 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n"
             "   1: 0B00E70A:4F20 0100E70A:C350 01 00000000:00000000 00:00000000 00000000     0        0 2\n")
    assert parse_listening(table) == {0x4F20}


def test_a_flag_makes_the_namespaced_nodes_routable_and_a_bad_one_is_named() -> None:
    env = {"SMARTCLIENT_TESTBED_NETWORK": "namespaces", "SMARTCLIENT_TESTBED_PORT_BASE": "20000"}
    assert not Layout.from_env(env).bed_network.routable
    assert "reject" in Layout.from_env(env).bed_network.fence_rules()
    assert Layout.from_env({**env, "SMARTCLIENT_TESTBED_ROUTABLE": "1"}).bed_network.routable
    with pytest.raises(ConfigurationError, match="SMARTCLIENT_TESTBED_ROUTABLE='maybe'"):
        Layout.from_env({**env, "SMARTCLIENT_TESTBED_ROUTABLE": "maybe"})
