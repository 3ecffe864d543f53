"""An AMQP 1.0 consumer recovering through a load balancer that no longer routes to its member asks for another."""

from __future__ import annotations

from typing import Any

import pytest

from smartclient import NodeUnreachable
from smartclient.amqp10._rabbitmq_amqp import QueueTopology
from smartclient.amqp10.clients import Amqp10Consumer
from smartclient.core.broker_nodes import queue_consumer_node
from smartclient.core.retry import RetryPolicy


class Placer:
    """The placer's side of a recovery: a quorum queue on three nodes, and a load balancer that reaches none of
    ``cut``."""

    def __init__(self, cut: set[str]) -> None:
        self.cut, self.asked = cut, []  # type: ignore[var-annotated]

    def queue_topology(self, queue: str) -> QueueTopology:
        return QueueTopology(queue, "quorum", "a@h", ("a@h", "b@h", "c@h"))

    def consumer_node(self, topology: QueueTopology, prefer: str, avoid: Any = ()) -> str:
        return queue_consumer_node(topology.name, topology.leader, topology.members, prefer, {"a@h": 1}, avoid)

    def connect(self, node: str, purpose: str, retry: RetryPolicy) -> Any:
        self.asked.append(node)
        raise NodeUnreachable(f"never routed to {node}")


def test_a_recovery_asks_for_another_member_once_the_lb_never_reached_one() -> None:
    placer = Placer(cut={"b@h"})
    consumer = Amqp10Consumer("q", placer, lambda message, accept: None)  # type: ignore[arg-type]
    for _ in range(3):
        with pytest.raises(NodeUnreachable):
            consumer._open(RetryPolicy())
    assert placer.asked == ["b@h", "c@h", "a@h"]  # the least used first, then those not tried yet
    for _ in range(2):
        with pytest.raises(NodeUnreachable):
            consumer._open(RetryPolicy())
    assert placer.asked[3:] == ["b@h", "c@h"]  # every member tried: round again, the last one tried last


def test_a_publishers_recovery_goes_to_another_member_when_the_lb_never_reached_its_leader() -> None:
    from smartclient.amqp10.placement import Amqp10Placer

    asked: list[str] = []
    placer = Amqp10Placer.__new__(Amqp10Placer)  # only what publisher_on asks of it
    placer.queue_topology = lambda queue: QueueTopology(queue, "quorum", "a@h", ("a@h", "b@h", "c@h"))  # type: ignore[method-assign]
    placer.clients_per_node = lambda: {}  # type: ignore[method-assign]

    def connect(node: str, purpose: str, retry: RetryPolicy) -> Any:
        asked.append(node)
        raise NodeUnreachable(f"never routed to {node}")

    placer.connect = connect  # type: ignore[method-assign]
    unreachable: set[str] = set()
    for _ in range(4):
        with pytest.raises(NodeUnreachable):
            placer.publisher_on("q", RetryPolicy(), unreachable)
    assert asked == ["a@h", "b@h", "c@h", "a@h"]  # the leader, then the others, then round again
    assert unreachable == {"c@h", "a@h"}  # the round before the last, and the leader again
