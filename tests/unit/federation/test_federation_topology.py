"""Federation topologies and their max_hops, under RabbitMQ's forwarding rule (hop limit + cycle detection).
No broker."""

from __future__ import annotations

import pytest

from smartclient import ConfigurationError
from smartclient.federation.topology import (
    FederatedBroker,
    UpstreamOptions,
    complete,
    compute_max_hops,
    copies,
    fan_out,
    graph,
    pair,
    ring,
)

B = [FederatedBroker(f"b{i}", f"http://h{i}:15672", f"amqp://u:p@h{i}:5672") for i in range(7)]


def hops(topology: object) -> dict[tuple[str, str], int]:
    return {(k.upstream, k.downstream): k.max_hops for k in topology.links}  # type: ignore[attr-defined]


def test_the_seeds_topologies_get_the_seeds_max_hops() -> None:
    assert set(hops(pair(B[0], B[1], "x")).values()) == {1}
    assert set(hops(complete(B[:3], "x")).values()) == {1}
    assert set(hops(ring(B[:6], "x")).values()) == {5}  # the seed's ring of six: max_hops 5
    tree = fan_out(B[:4], {"b0": ["b1", "b2"], "b1": ["b3"]}, "x")
    assert set(hops(tree).values()) == {2}  # depth 2


@pytest.mark.parametrize("build", [
    lambda: pair(B[0], B[1], "x"), lambda: complete(B[:4], "x"), lambda: ring(B[:4], "x"),
    lambda: fan_out(B[:6], {"b0": ["b1", "b2"], "b1": ["b3", "b4"], "b2": ["b5"]}, "x", both_ways=True),
])
def test_every_reachable_broker_gets_exactly_one_copy(build: object) -> None:
    topology = build()  # type: ignore[operator]
    for (origin, target), n in topology.copies().items():
        assert n == (1 if target in topology.reachable(origin) else 0), (origin, target)


def test_a_one_way_tree_reaches_the_subtree_only() -> None:
    tree = fan_out(B[:4], {"b0": ["b1", "b2"], "b1": ["b3"]}, "x")
    assert tree.reachable("b0") == {"b1", "b2", "b3"} and tree.reachable("b1") == {"b3"}
    assert tree.copies()[("b1", "b0")] == 0


def test_wrong_max_hops_lose_messages_in_a_ring_and_cycle_detection_stops_loops() -> None:
    r = ring(B[:4], "x")
    assert 0 in r.with_max_hops(2).copies().values()  # the far broker never gets it
    assert set(r.with_max_hops(9).copies().values()) == {1}  # too many: cycle detection, not duplicates


def test_a_ring_linked_both_ways_needs_different_hops_per_direction() -> None:
    edges = [(f"b{i}", f"b{(i + 1) % 4}") for i in range(4)] + [(f"b{(i + 1) % 4}", f"b{i}") for i in range(4)]
    names = [b.name for b in B[:4]]
    uniform2 = copies(edges, names, {e: 2 for e in edges})
    assert uniform2[("b0", "b2")] == 2  # the opposite broker, both ways round: a duplicate
    computed = compute_max_hops(edges, names)
    assert set(copies(edges, names, computed).values()) == {1}
    assert len(set(computed.values())) > 1


def test_a_graph_where_exactly_once_is_impossible_is_refused() -> None:
    # b0 reaches b3 along two paths of one link each... through b1 and b2, while b1 -> b3 and b2 -> b3 are
    # also first links on their own: any hop limit that lets b1's and b2's messages in lets b0's in twice
    edges = [("b0", "b1"), ("b0", "b2"), ("b1", "b3"), ("b2", "b3"), ("b1", "b2"), ("b2", "b1")]
    with pytest.raises(ConfigurationError, match="no max_hops gives exactly-once delivery"):
        graph(B[:4], edges, "x")


def test_bad_graphs_and_names_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="no link: nothing would reach them"):
        graph(B[:3], [("b0", "b1"), ("b1", "b0")], "x")
    with pytest.raises(ConfigurationError, match="no broker named 'b9'"):
        graph(B[:2], [("b0", "b9")], "x")
    with pytest.raises(ConfigurationError, match="exchange_type must be one of 'topic', .*, not 'x-consistent-hash'"):
        pair(B[0], B[1], "x", exchange_type="x-consistent-hash")
    with pytest.raises(ConfigurationError, match="not amq"):
        pair(B[0], B[1], "amq.topic")
    with pytest.raises(ConfigurationError, match="two parents"):
        fan_out(B[:3], {"b0": ["b2"], "b1": ["b2"]}, "x")
    with pytest.raises(ConfigurationError, match="at least three"):
        ring(B[:2], "x")
    with pytest.raises(ConfigurationError, match="not an amqp:// or amqps:// URI"):
        FederatedBroker("b", "http://h:15672", "http://h:5672")
    with pytest.raises(ConfigurationError, match="must start with http"):
        FederatedBroker("b", "h:15672", "amqp://h")


def test_upstream_options_are_validated_and_rendered() -> None:
    opts = UpstreamOptions(prefetch_count=50, reconnect_delay=2.5, heartbeat=10, expires=60_000, message_ttl=0,
                           tls_uri_params={"cacertfile": "/ca.pem", "verify": "verify_peer"})
    assert opts.value() == {"ack-mode": "on-confirm", "prefetch-count": 50, "reconnect-delay": 2.5,
                            "expires": 60_000, "message-ttl": 0}
    assert opts.uri("amqp://u:p@h") == "amqp://u:p@h?heartbeat=10"
    assert opts.uri("amqps://u:p@h") == "amqps://u:p@h?cacertfile=/ca.pem&heartbeat=10&verify=verify_peer"
    for bad in ({"prefetch_count": 0}, {"expires": 0}, {"message_ttl": -1}, {"heartbeat": 1.5},
                {"reconnect_delay": 0}, {"prefetch_count": True}, {"ack_mode": "sometimes"}):
        with pytest.raises(ConfigurationError):
            UpstreamOptions(**bad)  # type: ignore[arg-type]


def test_credentials_do_not_show_in_reprs_or_errors() -> None:
    broker = FederatedBroker("b", "http://h:15672", "amqp://u:secret@h:5672", password="hunter2")
    assert "hunter2" not in repr(broker) and "secret" not in repr(broker)
    with pytest.raises(ConfigurationError) as info:
        FederatedBroker("b", "http://h:15672", "amqpx://u:secret@h:5672")
    assert "secret" not in str(info.value)
