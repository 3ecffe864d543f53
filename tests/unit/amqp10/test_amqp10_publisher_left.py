"""An AMQP 1.0 publisher that lost its connection on a node goes to another member, and the queue's publishers do not
go back there at once (a recovery, a new one, a leader check): a node cut off from its peers still names itself the
leader to a look-up that reaches it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from smartclient import ConnectionFailed
from smartclient.amqp10 import clients
from smartclient.amqp10 import placement as amqp10_placement
from smartclient.amqp10._rabbitmq_amqp import QueueTopology
from smartclient.amqp10.clients import LEFT_FOR, Amqp10Publisher
from smartclient.amqp10.placement import Amqp10Placer
from smartclient.core.broker_nodes import CutOffNodes, LeftNodes, Unreachable, queue_publisher_node
from smartclient.core.recovery import RecoveryPolicy
from smartclient.core.retry import RetryPolicy

MEMBERS = ("a@h", "b@h", "c@h")


@dataclass
class _PublisherConnection:
    node: str
    closed: bool = False
    connection: Any = None
    ready: bool = False

    @contextlib.contextmanager
    def driving(self) -> Iterator[None]:
        yield

    def close(self, wait: bool = True) -> None:
        self.closed = True


@dataclass
class _StalePlacer:
    """The leader named is ``a@h`` whatever happens (the minority's own view); the core picks the node, avoiding
    what the real placer avoids (see the next test)."""

    placed_on: list[str] = field(default_factory=list)
    looked: int = 0  # leader look-ups
    tracer: Any = None
    recovery: RecoveryPolicy = field(default_factory=lambda: RecoveryPolicy(stall_check=1e-9))
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    left: LeftNodes = field(default_factory=lambda: LeftNodes(LEFT_FOR))

    def queue_topology(self, queue: str) -> QueueTopology:
        self.looked += 1
        return QueueTopology(queue, "quorum", "a@h", MEMBERS)

    def publisher_on(self, queue: str, retry: RetryPolicy, unreachable: Unreachable | None = None
                     ) -> tuple[_PublisherConnection, Any]:
        avoid = {*(unreachable.nodes if unreachable else ()), *filter(None, [self.left.recent(queue)])}
        node = queue_publisher_node(queue, "a@h", MEMBERS, {}, avoid)
        self.placed_on.append(node)
        return _PublisherConnection(node), node

    def recover(self, what: str, lost: BaseException, reopen: Callable[[RetryPolicy], Any], **_: Any) -> Any:
        return reopen(self.retry)


def test_a_publisher_that_lost_its_leader_s_node_goes_to_another_member_and_stays_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    cut = {"a@h"}

    def publish(publisher: str, body: bytes, what: str, properties: Any = None) -> None:
        if publisher in cut:  # the node cut off from its peers: no settlement comes
            raise ConnectionFailed("Sending on sender timed out")
        sent.append(publisher)

    monkeypatch.setattr(clients, "publish", publish)
    placer = _StalePlacer()
    publisher = Amqp10Publisher("q", _PublisherConnection("a@h"), "a@h", placer)  # type: ignore[arg-type]
    publisher.publish(b"1")
    assert placer.placed_on == ["b@h"] and sent == ["b@h"] and publisher.recoveries == 1
    looked = placer.looked
    for _ in range(3):  # each publish checks the leader (stall_check passed): a@h, which it left just now
        publisher.publish(b"2")
    assert placer.looked == looked + 3
    assert publisher.node == "b@h" and publisher.moves == 0 and placer.placed_on == ["b@h"]

    cut.clear()  # healed, and later on: the leader named is followed again
    placer.left = LeftNodes(0.0)
    publisher.publish(b"3")
    assert placer.placed_on == ["b@h", "a@h"] and publisher.moves == 1 and sent[-1] == "a@h"


def test_a_new_publisher_of_the_queue_avoids_the_node_one_left_lately(monkeypatch: pytest.MonkeyPatch) -> None:
    """The application makes a new publisher after the last one failed: the real placer sends it to another member,
    not to the leader a look-up still names, until LEFT_FOR passed."""
    now = [0.0]
    placer = Amqp10Placer.__new__(Amqp10Placer)
    placer.left, placer.cut_off = LeftNodes(LEFT_FOR, clock=lambda: now[0]), CutOffNodes()
    placer.queue_topology = lambda queue: QueueTopology(queue, "quorum", "a@h", MEMBERS)  # type: ignore[method-assign]
    placer.clients_per_node = lambda: {"b@h": 1}  # type: ignore[method-assign]
    placer.connect = lambda node, purpose, retry: _PublisherConnection(node)  # type: ignore[assignment,method-assign,return-value]
    monkeypatch.setattr(amqp10_placement, "new_publisher", lambda connection, queue: "link")
    assert placer.publisher_on("q", RetryPolicy())[0].node == "a@h"  # the leader
    placer.left.add("q", "a@h")
    assert placer.publisher_on("q", RetryPolicy())[0].node == "c@h"  # the least used other member
    assert placer.publisher_on("other", RetryPolicy())[0].node == "a@h"  # per queue
    now[0] = LEFT_FOR
    assert placer.publisher_on("q", RetryPolicy())[0].node == "a@h"
