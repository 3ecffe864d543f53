"""The test bed itself: three clustered nodes, streams spread over them, LB and DNS answering."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from typing import Any

import dns.resolver
import pytest

from smartclient import FaultUnavailable
from smartclient.testing import TestBed


def test_three_nodes_running_and_clustered(rabbitmq_testbed: TestBed) -> None:
    with rabbitmq_testbed.management() as api:
        nodes = api.nodes()
    assert sorted(n["name"] for n in nodes) == sorted(n.name for n in rabbitmq_testbed.nodes)
    assert len(nodes) == 3
    assert all(n["running"] for n in nodes)


async def test_stream_of_cluster_size_3_has_leader_and_two_replicas(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, open_stream_client: Any
) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with open_stream_client(node.host, node.stream_port) as client:
        await client.create_stream(rabbitmq_unique_name, {"initial-cluster-size": 3})
        try:
            leader, replicas = None, []
            for _ in range(100):  # the leader, then the replicas, come up asynchronously
                try:
                    leader, replicas = await client.query_leader_and_replicas(rabbitmq_unique_name)
                    if len(replicas) == 2:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.1)
            assert leader is not None
            members = [(leader.host, leader.port)] + [(r.host, r.port) for r in replicas]
            assert len(replicas) == 2
            assert len(set(members)) == 3
            bed = rabbitmq_testbed
            assert {bed.node_by_advertised(h, p).name for h, p in members} == {n.name for n in bed.nodes}
            assert bed.node_by_advertised(leader.host, leader.port).name == bed.stream_leader(rabbitmq_unique_name)
        finally:
            await client.delete_stream(rabbitmq_unique_name)


async def test_nine_connections_through_round_robin_lb_reach_each_node_three_times(
    rabbitmq_testbed: TestBed, open_stream_client: Any
) -> None:
    host, port = rabbitmq_testbed.lb("stream")
    reached: Counter[str] = Counter()
    for _ in range(9):
        async with open_stream_client(host, port) as client:
            props = client.server_properties
            reached[rabbitmq_testbed.node_by_advertised(props["advertised_host"],
                                                        int(props["advertised_port"])).name] += 1
    assert reached == Counter({n.name: 3 for n in rabbitmq_testbed.nodes})


async def test_source_balanced_listener_is_sticky_and_random_reaches_several(
    rabbitmq_testbed: TestBed, open_stream_client: Any
) -> None:
    async def nodes_reached(balance: str, count: int) -> Counter[str]:
        host, port = rabbitmq_testbed.lb("stream", balance)
        seen: Counter[str] = Counter()
        for _ in range(count):
            async with open_stream_client(host, port) as client:
                seen[client.server_properties["advertised_port"]] += 1
        return seen

    assert len(await nodes_reached("source", 6)) == 1
    assert len(await nodes_reached("random", 12)) >= 2  # all 12 on one node: p = 3 * (1/3)**12


def test_dns_answers_a_and_srv_through_dnspython(rabbitmq_testbed: TestBed) -> None:
    host, port = rabbitmq_testbed.dns_address
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = [host]
    resolver.port = port
    resolver.lifetime = 2.0
    assert [r.address for r in resolver.resolve("rabbit-2.smartclient.test", "A")] == ["127.0.0.1"]
    srv = resolver.resolve("_rabbitmq-stream._tcp.smartclient.test", "SRV")
    assert sorted(r.port for r in srv) == sorted(n.stream_port for n in rabbitmq_testbed.nodes)
    assert {str(r.target) for r in srv} == {f"{n.short}.smartclient.test." for n in rabbitmq_testbed.nodes}
    lb_srv = resolver.resolve("_amqp._tcp.lb.smartclient.test", "SRV")
    assert [r.port for r in lb_srv] == [rabbitmq_testbed.lb("amqp")[1]]
    with pytest.raises(dns.resolver.NXDOMAIN):
        resolver.resolve("nowhere.smartclient.test", "A")


def test_status_command_prints_the_table(rabbitmq_testbed: TestBed) -> None:
    out = subprocess.run([sys.executable, "-m", "smartclient.testing", "status"], capture_output=True,
                         text=True, check=True).stdout
    for node in rabbitmq_testbed.nodes:
        assert node.name in out
    assert "cluster: 3 running" in out
    assert "stream_roundrobin" in out and "UP" in out
    assert f"RabbitMQ {rabbitmq_testbed.rabbitmq_version()}" in out and f"DNS 127.0.0.1:{rabbitmq_testbed.dns_address[1]}  running" in out


def test_up_is_idempotent_and_reuses_a_healthy_test_bed(rabbitmq_testbed: TestBed) -> None:
    from smartclient.testing.local import LocalTestBed

    if not isinstance(rabbitmq_testbed, LocalTestBed):
        raise FaultUnavailable("up() belongs to the local test bed")
    pids = [b.pid() for b in rabbitmq_testbed.brokers]
    report = rabbitmq_testbed.up()
    assert report.reused and report.actions == []
    assert [b.pid() for b in rabbitmq_testbed.brokers] == pids
