"""An AMQP 1.0 client recovering through a load balancer that no longer routes to its member asks for another."""

from __future__ import annotations

import time
from typing import Any

import pytest

from smartclient import NodeUnreachable
from smartclient.amqp10._rabbitmq_amqp import QueueTopology
from smartclient.amqp10.clients import LEFT_FOR, Amqp10Consumer
from smartclient.amqp10.placement import Amqp10Placer
from smartclient.core.broker_nodes import CutOffNodes, LeftNodes, Unreachable
from smartclient.core.retry import RetryPolicy


def _placer(asked: list[str], used: dict[str, int]) -> Amqp10Placer:
    """A placer whose queue is a quorum queue on three nodes (led by a@h), behind a load balancer that reaches
    none of them: only what the placements ask of it."""
    placer = Amqp10Placer.__new__(Amqp10Placer)
    placer.left, placer.cut_off = LeftNodes(LEFT_FOR), CutOffNodes()
    placer.queue_topology = lambda queue: QueueTopology(queue, "quorum", "a@h", ("a@h", "b@h", "c@h"))  # type: ignore[method-assign]
    placer.clients_per_node = lambda: used  # type: ignore[method-assign]

    def connect(node: str, purpose: str, retry: RetryPolicy) -> Any:
        asked.append(node)
        raise NodeUnreachable(f"never routed to {node}")

    placer.connect = connect  # type: ignore[method-assign]
    return placer


def test_a_recovery_asks_for_another_member_once_the_lb_never_reached_one() -> None:
    asked: list[str] = []
    consumer = Amqp10Consumer("q", _placer(asked, {"a@h": 1}), lambda message, accept: None)
    for _ in range(3):
        with pytest.raises(NodeUnreachable):
            consumer._open(RetryPolicy())
    assert asked == ["b@h", "c@h", "a@h"]  # the least used first, then those not tried yet
    for _ in range(2):
        with pytest.raises(NodeUnreachable):
            consumer._open(RetryPolicy())
    assert asked[3:] == ["b@h", "c@h"]  # every member tried: round again, the last one tried last


def test_a_publishers_recovery_goes_to_another_member_when_the_lb_never_reached_its_leader() -> None:
    asked: list[str] = []
    placer = _placer(asked, {})
    unreachable = Unreachable()
    for _ in range(4):
        with pytest.raises(NodeUnreachable):
            placer.publisher_on("q", RetryPolicy(), unreachable)
    assert asked == ["a@h", "b@h", "c@h", "a@h"]  # the leader, then the others, then round again
    assert unreachable.nodes == {"c@h", "a@h"}  # the round before the last, and the leader again
    assert unreachable.rounds == 1  # every member failed once


def test_a_leader_preferring_consumer_goes_to_another_member_when_the_lb_never_reached_the_leader() -> None:
    asked: list[str] = []
    consumer = Amqp10Consumer("q", _placer(asked, {"b@h": 1}), lambda message, accept: None, prefer="leader")
    for _ in range(3):
        with pytest.raises(NodeUnreachable):
            consumer._open(RetryPolicy())
    assert asked == ["a@h", "c@h", "b@h"]  # the leader, then the least used of the others


def test_a_publisher_that_could_not_follow_its_leader_tries_again_later_each_time() -> None:
    from types import SimpleNamespace

    from smartclient import RecoveryPolicy
    from smartclient.amqp10.clients import Amqp10Publisher

    asked: list[str] = []
    placer = _placer(asked, {})
    placer.recovery = RecoveryPolicy(stall_check=2.0)
    placer.retry = RetryPolicy()
    publisher = Amqp10Publisher("q", SimpleNamespace(node="b@h"), None, placer)  # type: ignore[arg-type]
    waits = []
    for _ in range(5):
        publisher._follow()
        waits.append(publisher._checked - time.monotonic())
    assert asked == ["a@h"] * 5 and publisher.node == "b@h"  # the leader each time; it stays meanwhile
    assert [round(w) for w in waits] == [0, 2, 4, 8, 16]  # checked again after 2, 4, 6, 10, 18 s (stall_check 2)


def test_a_new_publisher_goes_to_another_member_when_the_lb_never_reached_its_leader() -> None:
    """Not only a recovery: a publisher made while the leader is cut off from the load balancer publishes through
    another member (which forwards the writes); no member reached is NodeUnreachable after each was tried once."""
    asked: list[str] = []
    placer = _placer(asked, {"b@h": 1})
    placer.retry = RetryPolicy()
    with pytest.raises(NodeUnreachable):
        placer.publisher("q")
    assert asked == ["a@h", "c@h", "b@h"]  # the leader, then the least used of the others: each once
    asked.clear()
    connect = placer.connect
    made: list[tuple[str, Any]] = []

    def reach_c(node: str, purpose: str, retry: RetryPolicy) -> Any:
        if node != "c@h":
            return connect(node, purpose, retry)
        asked.append(node)
        made.append((node, purpose))
        return type("Placed", (), {"connection": None, "node": node, "ready": False, "close": lambda self: None})()

    placer.connect = reach_c  # type: ignore[method-assign]
    import smartclient.amqp10.placement as placement

    original = placement.new_publisher
    placement.new_publisher = lambda connection, queue: "link"  # type: ignore[assignment]
    try:
        publisher = placer.publisher("q")
    finally:
        placement.new_publisher = original
    assert asked == ["a@h", "c@h"] and publisher.node == "c@h" and made == [("c@h", "publisher")]


def test_a_consumer_on_a_node_found_cut_off_since_it_was_placed_ends_its_loop_and_its_recovery_goes_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another wing found the consumer's node cut off from its peers: the consumer's loop raises at its next pass (its
    recovery follows), and the placement takes another member."""
    from types import SimpleNamespace

    from smartclient import ConnectionFailed
    from smartclient.amqp10 import clients

    asked: list[str] = []
    placer = _placer(asked, {})
    placer.connect = lambda node, purpose, retry: (  # type: ignore[method-assign]
        asked.append(node) or SimpleNamespace(node=node, connection=None, take_token=lambda: None, wake=None))
    monkeypatch.setattr(clients, "new_consumer", lambda *a, **k: SimpleNamespace(between=None, wake=None))
    consumer = Amqp10Consumer("q", placer, lambda message, accept: None, prefer="leader")
    placed, loop = consumer._open(RetryPolicy())
    assert placed.node == "a@h"
    loop.between()  # nothing found: a pass goes on
    placer.cut_off.found("a@h", "the PUBACK watch of MQTT client m")
    with pytest.raises(ConnectionFailed, match="a@h was found cut off from its peers, by the PUBACK watch of MQTT"):
        loop.between()
    placed, loop = consumer._open(RetryPolicy())  # its recovery: the leader's node is avoided while another will do
    assert placed.node != "a@h" and asked == ["a@h", placed.node]
    loop.between()  # placed after the finding: it stays
