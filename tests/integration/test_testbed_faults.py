"""Every fault the test bed injects does what it says, and heal() brings the test bed back."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import dns.exception
import dns.resolver
import pytest

from smartclient import FaultUnavailable, TestBedError
from smartclient.management import ManagementClient
from smartclient.testing import TestBed
from smartclient.testing.external import ExternalTestBed
from smartclient.testing.processes import pid_alive, port_accepts, wait_until

pytestmark = pytest.mark.faults


async def _members(client: Any, stream: str, want_replicas: int = 2) -> tuple[Any, list[Any]]:
    leader, replicas = None, []
    for _ in range(150):
        try:
            leader, replicas = await client.query_leader_and_replicas(stream)
            if len(replicas) >= want_replicas:
                return leader, replicas
        except Exception:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{stream}: leader {leader}, replicas {replicas}")


def _running_nodes(bed: TestBed) -> set[str]:
    with bed.management() as api:
        return {n["name"] for n in api.nodes() if n["running"]}


async def test_kill_9_by_pid_then_restart(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str, open_stream_client: Any
) -> None:
    bed = rabbitmq_faulty_testbed
    victim, survivor = bed.nodes[2], bed.nodes[0]
    async with open_stream_client(victim.host, victim.stream_port) as client:  # client-local: leader on victim
        await client.create_stream(rabbitmq_unique_name, {"initial-cluster-size": 3})
        leader, _ = await _members(client, rabbitmq_unique_name)
    assert bed.node_by_advertised(leader.host, leader.port) == victim

    pid = bed.kill_node(victim.name)
    assert not pid_alive(pid)
    assert not port_accepts(victim.stream_port)
    wait_until(lambda: victim.name not in _running_nodes(bed), 30, "the cluster to see the node down")
    async with open_stream_client(survivor.host, survivor.stream_port) as client:
        leader, _ = await _members(client, rabbitmq_unique_name, want_replicas=1)
        assert bed.node_by_advertised(leader.host, leader.port) != victim  # a new leader was elected

    bed.restart_node(victim.name)
    assert _running_nodes(bed) == {n.name for n in bed.nodes}
    async with open_stream_client(survivor.host, survivor.stream_port) as client:
        await _members(client, rabbitmq_unique_name)  # leader and both replicas again
        await client.delete_stream(rabbitmq_unique_name)


def test_stop_app_and_start_app(rabbitmq_faulty_testbed: TestBed) -> None:
    node = rabbitmq_faulty_testbed.nodes[1]
    rabbitmq_faulty_testbed.stop_app(node.name)
    assert not port_accepts(node.stream_port) and not port_accepts(node.amqp_port)
    wait_until(lambda: node.name not in _running_nodes(rabbitmq_faulty_testbed), 30, "the app to be reported stopped")
    rabbitmq_faulty_testbed.start_app(node.name)
    assert port_accepts(node.stream_port) and port_accepts(node.amqp_port)
    wait_until(lambda: node.name in _running_nodes(rabbitmq_faulty_testbed), 30, "the app to be reported running")


async def test_move_leader(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str, open_stream_client: Any
) -> None:
    bed = rabbitmq_faulty_testbed
    first = bed.nodes[0]
    async with open_stream_client(first.host, first.stream_port) as client:
        await client.create_stream(rabbitmq_unique_name, {"initial-cluster-size": 3})
        await _members(client, rabbitmq_unique_name)
        assert bed.stream_leader(rabbitmq_unique_name) == first.name
        assert await asyncio.to_thread(bed.move_leader, rabbitmq_unique_name, "rabbit-2") == "rabbit-2@localhost"
        # the management API reports it within a statistics round
        await asyncio.to_thread(wait_until, lambda: bed.stream_leader(rabbitmq_unique_name) == "rabbit-2@localhost",
                                15, "the management API to report the new leader")
        leader, _ = await _members(client, rabbitmq_unique_name)
        assert bed.node_by_advertised(leader.host, leader.port).name == "rabbit-2@localhost"
        await client.delete_stream(rabbitmq_unique_name)


async def test_close_connection_through_management_api(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str, open_stream_client: Any
) -> None:
    node = rabbitmq_faulty_testbed.nodes[0]
    async with open_stream_client(node.host, node.stream_port, name=rabbitmq_unique_name) as client:
        rabbitmq_faulty_testbed.close_connection(rabbitmq_faulty_testbed.connection_named(rabbitmq_unique_name))
        deadline = time.monotonic() + 10
        while client.is_connection_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not client.is_connection_alive()


async def test_disable_and_enable_lb_backend(rabbitmq_faulty_testbed: TestBed, open_stream_client: Any) -> None:
    bed = rabbitmq_faulty_testbed
    host, port = bed.lb("stream")

    async def reached(count: int) -> Counter[str]:
        seen: Counter[str] = Counter()
        for _ in range(count):
            async with open_stream_client(host, port) as client:
                props = client.server_properties
                seen[bed.node_by_advertised(props["advertised_host"], int(props["advertised_port"])).short] += 1
        return seen

    bed.disable_lb_backend("rabbit-1", "stream_roundrobin")
    assert set(await reached(6)) == {"rabbit-2", "rabbit-3"}
    bed.enable_lb_backend("rabbit-1", "stream_roundrobin")
    # back in rotation; HAProxy's round robin may hand a returning server several connections in a row
    # while it catches up, so only its return is certain within a few connections
    assert "rabbit-1" in set(await reached(6))


def test_lb_backend_in_maintenance_is_healed(rabbitmq_faulty_testbed: TestBed) -> None:
    from smartclient.testing.local import LocalTestBed

    if not isinstance(rabbitmq_faulty_testbed, LocalTestBed):
        raise FaultUnavailable("the HAProxy admin socket belongs to the local test bed")
    rabbitmq_faulty_testbed.haproxy.set_maint("rabbit-2")  # every listener
    states = rabbitmq_faulty_testbed.haproxy.server_states()
    assert {listener: servers["rabbit-2"] for listener, servers in states.items()} == {
        name: "MAINT" for name in states
    }
    rabbitmq_faulty_testbed.heal()
    states = rabbitmq_faulty_testbed.haproxy.server_states()
    assert all(s == "UP" for servers in states.values() for s in servers.values())


def test_a_rolling_restart_step_removes_a_stream_record_the_coordinator_forgot(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """A deletion cut by a fault can leave a stream record the coordinator no longer knows, and the operator's
    pre-stop check then crashes on every node (seen in CI, where no node was rolled): the step removes it."""
    from smartclient.testing.local import LocalTestBed

    bed = rabbitmq_faulty_testbed
    if not isinstance(bed, LocalTestBed):
        raise FaultUnavailable("the orphan is made with rabbitmqctl eval on the local test bed")
    name = rabbitmq_unique_name
    ref = f'rabbit_misc:r(<<"/">>, queue, <<"{name}">>)'
    ctl = bed.brokers[0].ctl
    ctl(["eval", f'rabbit_amqqueue:declare({ref}, true, false, [{{<<"x-queue-type">>, longstr, <<"stream">>}}], '
                 'none, <<"guest">>).'])
    # the coordinator deletes the stream; the record's own deletion, as if it timed out, never comes
    ctl(["eval", f"{{ok, Q}} = rabbit_amqqueue:lookup({ref}), #{{name := Id}} = amqqueue:get_type_state(Q), "
                 "rabbit_stream_coordinator:process_command({delete_stream, Id, #{}})."])
    node = bed.nodes[0].name
    assert bed.orphan_streams(node) == [("/", name)]
    with pytest.raises(TestBedError, match="list_with_minimum_quorum"):  # the broker's own check crashes on it
        bed.brokers[0].tool("rabbitmq-upgrade", ["await_online_quorum_plus_one", "-t", "5"], timeout=30)
    bed.roll_node(node)
    assert [bed.orphan_streams(n.name) for n in bed.nodes] == [[], [], []]


def _resolver(bed: TestBed) -> dns.resolver.Resolver:
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = [bed.dns_address[0]]
    resolver.port = bed.dns_address[1]
    resolver.lifetime = 1.0
    return resolver


def test_stop_and_start_dns(rabbitmq_faulty_testbed: TestBed) -> None:
    resolver = _resolver(rabbitmq_faulty_testbed)
    rabbitmq_faulty_testbed.stop_dns()
    with pytest.raises((dns.exception.Timeout, dns.resolver.NoNameservers)):
        resolver.resolve("lb.smartclient.test", "A")
    rabbitmq_faulty_testbed.start_dns()
    assert [r.address for r in resolver.resolve("lb.smartclient.test", "A")] == ["127.0.0.1"]


def test_records_added_live_and_drop_gives_a_timeout(rabbitmq_faulty_testbed: TestBed) -> None:
    resolver = _resolver(rabbitmq_faulty_testbed)
    rabbitmq_faulty_testbed.add_dns_record("new-node.smartclient.test", "A", "127.0.0.9", ttl=1)
    answer = resolver.resolve("new-node.smartclient.test", "A")
    assert [r.address for r in answer] == ["127.0.0.9"] and answer.rrset is not None and answer.rrset.ttl == 1
    rabbitmq_faulty_testbed.add_dns_record("silent.smartclient.test", "DROP", "-")
    with pytest.raises(dns.exception.Timeout):
        resolver.resolve("silent.smartclient.test", "A")
    rabbitmq_faulty_testbed.heal()  # resets the zone
    with pytest.raises(dns.resolver.NXDOMAIN):
        resolver.resolve("new-node.smartclient.test", "A")


def test_extra_independent_brokers(rabbitmq_faulty_testbed: TestBed) -> None:
    from smartclient.testing.local import LocalTestBed

    bed = rabbitmq_faulty_testbed
    brokers = bed.start_brokers(2)
    try:
        assert [b.name for b in brokers] == ["broker-1@localhost", "broker-2@localhost"]
        for broker in brokers:
            with ManagementClient(broker.management_url, bed.username, bed.password) as api:
                assert [n["name"] for n in api.nodes()] == [broker.name]  # a cluster of one
        assert _running_nodes(bed) == {n.name for n in bed.nodes}  # the cluster did not grow
    finally:
        if isinstance(bed, LocalTestBed):
            bed.stop_brokers()


async def test_external_test_bed_attaches_to_a_running_cluster(
    rabbitmq_testbed: TestBed, open_stream_client: Any
) -> None:
    config = {
        "username": rabbitmq_testbed.username, "password": rabbitmq_testbed.password,
        "nodes": [{"name": n.name, "host": n.host, "stream_port": n.stream_port, "amqp_port": n.amqp_port,
                   "mqtt_port": n.mqtt_port, "management_port": n.management_port,
                   "advertised_host": n.advertised_host} for n in rabbitmq_testbed.nodes],
        "lb": dict(zip(("host", "stream_port"), rabbitmq_testbed.lb("stream"), strict=True)),
    }
    external = ExternalTestBed.from_config(json.dumps(config))
    assert _running_nodes(external) == {n.name for n in rabbitmq_testbed.nodes}
    async with open_stream_client(*external.lb("stream")) as client:
        props = client.server_properties
        assert external.node_by_advertised(props["advertised_host"], int(props["advertised_port"]))
    assert "kill -9" in external.status_table() or "external" in external.status_table()
