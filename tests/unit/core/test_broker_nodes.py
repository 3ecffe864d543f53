"""Nodes and listeners from the management API's overview (pure parsing), and the AMQP/RPC input checks."""

from __future__ import annotations

import pytest

from smartclient import Address, ConfigurationError, NoCandidateNode
from smartclient.amqp.rpc import Coverage
from smartclient.amqp.streams import stream_qos
from smartclient.core.broker_nodes import BrokerNode, LeftNodes, node_host, nodes_from_overview, pick_node

OVERVIEW = {"listeners": [
    {"node": "rabbit-2@host-b", "protocol": "amqp", "ip_address": "::", "port": 5672},
    {"node": "rabbit-1@host-a", "protocol": "amqp", "ip_address": "0.0.0.0", "port": 5672},
    {"node": "rabbit-1@host-a", "protocol": "stream", "ip_address": "10.0.0.1", "port": 5552},
    {"node": "rabbit-1@host-a", "protocol": "mqtt", "ip_address": "::", "port": 1883},
]}


def test_listeners_bound_to_any_address_are_advertised_with_the_node_host() -> None:
    nodes = nodes_from_overview(OVERVIEW)
    assert [n.name for n in nodes] == ["rabbit-1@host-a", "rabbit-2@host-b"]
    first = nodes[0]
    assert first.address("amqp") == Address("host-a", 5672)
    assert first.address("stream") == Address("10.0.0.1", 5552)  # bound to one IP: that IP
    assert nodes[1].address("amqp") == Address("host-b", 5672)


def test_a_missing_listener_or_node_is_a_typed_error_naming_it() -> None:
    nodes = nodes_from_overview(OVERVIEW)
    with pytest.raises(NoCandidateNode, match="rabbit-2@host-b has no mqtt listener"):
        nodes[1].address("mqtt")
    assert pick_node(nodes, "rabbit-2").name == "rabbit-2@host-b"
    assert pick_node(nodes, "rabbit-1@host-a") is nodes[0]
    with pytest.raises(NoCandidateNode, match="no node named 'rabbit-3'"):
        pick_node(nodes, "rabbit-3")


def test_node_names_need_a_host() -> None:
    assert node_host("rabbit@db-1.example") == "db-1.example"
    with pytest.raises(ConfigurationError):
        node_host("rabbit")


def test_empty_overview_gives_no_nodes() -> None:
    assert nodes_from_overview({}) == []
    assert BrokerNode("a@b").short == "a"


class RecordingChannel:
    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def basic_qos(self, **kwargs: object) -> None:
        self.calls.append(kwargs)


@pytest.mark.parametrize("prefetch", [0, -1, True, 1.5, "10"])
def test_stream_consumers_need_a_positive_per_consumer_prefetch(prefetch: object) -> None:
    channel = RecordingChannel()
    with pytest.raises(ConfigurationError, match="prefetch"):
        stream_qos(channel, prefetch)  # type: ignore[arg-type]
    assert channel.calls == []


def test_global_qos_is_refused_and_never_sent() -> None:
    channel = RecordingChannel()
    with pytest.raises(ConfigurationError, match="global QoS"):
        stream_qos(channel, 10, global_qos=True)
    stream_qos(channel, 10)
    assert channel.calls == [{"prefetch_count": 10, "global_qos": False}]


def test_coverage_report_names_the_nodes_without_servers() -> None:
    report = Coverage("rpc", {"rabbit-1@a": 2}, ("rabbit-2@b",))
    assert not report.complete
    assert "rabbit-1@a (2)" in str(report) and "without a server: rabbit-2@b" in str(report)


def test_a_queue_consumer_goes_where_its_preference_says_the_least_used_member_first() -> None:
    from smartclient import NoCandidateNode, TopologyError
    from smartclient.core.broker_nodes import queue_consumer_node

    members = ("a@h", "b@h", "c@h")
    assert queue_consumer_node("q", "b@h", members, "leader", {}) == "b@h"
    assert queue_consumer_node("q", "b@h", members, "replica", {"a@h": 2}) == "c@h"  # not the leader, least used
    assert queue_consumer_node("q", "b@h", members, "member", {"a@h": 1, "c@h": 1}) == "b@h"
    assert queue_consumer_node("q", "b@h", ("b@h",), "replica", {}) == "b@h"  # the leader when there is no other
    with pytest.raises(NoCandidateNode, match="no member"):
        queue_consumer_node("q", None, (), "member", {})
    with pytest.raises(TopologyError, match="no leader"):
        queue_consumer_node("q", None, members, "leader", {})


def test_a_queue_consumer_avoids_a_member_it_could_not_reach_unless_every_one_is() -> None:
    from smartclient.core.broker_nodes import queue_consumer_node

    members = ("a@h", "b@h", "c@h")
    assert queue_consumer_node("q", "b@h", members, "member", {"b@h": 1, "c@h": 1}, avoid={"a@h"}) == "b@h"
    assert queue_consumer_node("q", "b@h", members, "replica", {}, avoid={"a@h"}) == "c@h"
    assert queue_consumer_node("q", "b@h", members, "member", {}, avoid=set(members)) == "a@h"  # all: as before
    # a leader it cannot reach: another member, the least used (every member serves the queue), until it can
    assert queue_consumer_node("q", "b@h", members, "leader", {"a@h": 1}, avoid={"b@h"}) == "c@h"
    assert queue_consumer_node("q", "b@h", members, "leader", {}, avoid=set(members)) == "b@h"
    # replicas it cannot reach: the leader
    assert queue_consumer_node("q", "b@h", members, "replica", {}, avoid={"a@h", "c@h"}) == "b@h"


def test_a_queue_publisher_goes_to_the_leader_or_to_a_member_when_it_could_not_reach_it() -> None:
    from smartclient import TopologyError
    from smartclient.core.broker_nodes import queue_publisher_node

    members = ("a@h", "b@h", "c@h")
    assert queue_publisher_node("q", "b@h", members, {}) == "b@h"
    assert queue_publisher_node("q", "b@h", members, {"a@h": 2}, avoid={"b@h"}) == "c@h"  # forwards to the leader
    assert queue_publisher_node("q", "b@h", members, {}, avoid=set(members)) == "b@h"  # none reached: the leader
    with pytest.raises(TopologyError, match="no leader"):
        queue_publisher_node("q", None, members, {})


def test_the_unreachable_nodes_start_a_new_round_once_every_member_failed_and_go_once_placed() -> None:
    from smartclient.core.broker_nodes import Unreachable

    unreachable = Unreachable()
    unreachable.failed("a@h", ("a@h", "b@h"))
    assert unreachable.nodes == {"a@h"}
    unreachable.failed("b@h", ("a@h", "b@h"))
    assert unreachable.nodes == {"b@h"}  # every one tried: round again, the last one tried last
    unreachable.placed()
    assert unreachable.nodes == set()


def test_any_node_tiers_put_the_avoided_nodes_last_and_keep_one_tier_when_nothing_is_left_to_prefer() -> None:
    from smartclient.core.broker_nodes import any_node_tiers

    nodes = {"a1": "rabbit-1", "a2": "rabbit-2", "a3": "rabbit-3"}
    assert any_node_tiers(nodes, ()) == (("a1", "a2", "a3"),)
    assert any_node_tiers(nodes, {"rabbit-2"}) == (("a1", "a3"), ("a2",))
    assert any_node_tiers(nodes, {"rabbit-1", "rabbit-2", "rabbit-3"}) == (("a1", "a2", "a3"),)


def test_a_node_left_is_remembered_per_queue_for_its_seconds_only() -> None:
    now = [100.0]
    left = LeftNodes(30.0, clock=lambda: now[0])
    assert left.recent("q") is None
    left.add("q", "rabbit-1@h")
    now[0] = 129.9
    assert left.recent("q") == "rabbit-1@h" and left.recent("other") is None
    now[0] = 130.0
    assert left.recent("q") is None
