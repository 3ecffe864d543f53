"""A producer recovered from a leader change checks the leader again once the election settled. No broker."""

from __future__ import annotations

import asyncio
from typing import Any

from smartclient import Address, RecoveryPolicy
from smartclient.core.topology import Role, StreamTopology
from smartclient.stream.handles import Producer
from smartclient.stream.host import PlacementRecord


class FakeHost:
    recovery = RecoveryPolicy()

    def __init__(self, node: Address, leader: Address) -> None:
        self.node, self.leader = node, leader
        self.dropped = 0

    def drop_topology(self, stream: str) -> None:
        self.dropped += 1

    async def topology(self, stream: str) -> StreamTopology:
        return StreamTopology(stream, self.leader, ())

    def placement_of(self, carrier: Any, stream: str) -> PlacementRecord | None:
        return PlacementRecord(Role.PRODUCER, stream, "p", self.node, self.node, "c-1")


def _producer(host: FakeHost) -> tuple[Producer, list[str]]:
    producer = Producer(host, object(), "s", "p")  # type: ignore[arg-type]
    losses: list[str] = []
    producer._lost = losses.append  # type: ignore[method-assign]
    return producer, losses


async def test_landed_on_the_old_leader_it_moves_again() -> None:
    host = FakeHost(node=Address("n1", 5552), leader=Address("n3", 5552))
    producer, losses = _producer(host)
    await producer._confirm_leader(after=(0.0,))
    assert losses == ["the leader moved to n3:5552 while it was recovering"] and host.dropped == 1


async def test_on_the_leader_it_stays_and_a_closed_producer_is_left_alone() -> None:
    host = FakeHost(node=Address("n3", 5552), leader=Address("n3", 5552))
    producer, losses = _producer(host)
    await producer._confirm_leader(after=(0.0, 0.0))
    assert losses == [] and host.dropped == 2
    producer.closed = True
    host.leader = Address("n1", 5552)
    await asyncio.wait_for(producer._confirm_leader(after=(0.0,)), 1)
    assert losses == []
