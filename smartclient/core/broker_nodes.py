"""The nodes of a cluster and their listeners, as the management API describes them.  No I/O.

AMQP 0.9.1 and MQTT do not say which node a connection reached, and their ports are not in the stream
protocol's metadata.  The management API's ``/api/overview`` lists every listener of every node
(``{"node": "rabbit-1@host", "protocol": "amqp", "ip_address": "::", "port": 5672}``); this module
turns that into :class:`BrokerNode` values, whose *advertised* address for a protocol is the node's
host name (or the listener's own IP when it is bound to one) with the listener's port.  The
resolver maps it to what can be dialled, as for streams.

It also decides where each connection of a protocol without streams may go, as candidate lists that the
one placement loop (:class:`~smartclient.core.landing.Placement`) drives: a fleet's spread
(:func:`spread_candidates`, :func:`rebalance`) and a dropped connection's reconnect
(:func:`reconnect_candidates`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from smartclient._errors import ConfigurationError, NoCandidateNode, TopologyError
from smartclient.core.address import Address
from smartclient.core.topology import Candidates, Role

__all__ = [
    "BrokerNode",
    "CutOffNodes",
    "LeftNodes",
    "Unreachable",
    "any_node_tiers",
    "evenly_spread",
    "node_host",
    "nodes_from_overview",
    "pick_node",
    "queue_consumer_node",
    "queue_publisher_node",
    "rebalance",
    "reconnect_candidates",
    "rotated",
    "spread_candidates",
    "surplus",
]

T = TypeVar("T")

_ANY = {"::", "0.0.0.0", "", "[::]"}


def node_host(node: str) -> str:
    """The host part of an Erlang node name: ``rabbit-1@localhost`` -> ``localhost``."""
    if "@" not in node:
        raise ConfigurationError(f"{node!r} is not a RabbitMQ node name (name@host)")
    return node.split("@", 1)[1]


@dataclass(frozen=True)
class BrokerNode:
    """One node: its Erlang name and its listeners (protocol -> advertised address)."""

    name: str
    listeners: Mapping[str, Address] = field(default_factory=dict)

    def address(self, protocol: str) -> Address:
        try:
            return self.listeners[protocol]
        except KeyError:
            raise NoCandidateNode(
                f"node {self.name} has no {protocol} listener (it has: {', '.join(sorted(self.listeners)) or 'none'})"
            ) from None

    @property
    def short(self) -> str:
        return self.name.split("@", 1)[0]


def nodes_from_overview(overview: Mapping[str, Any]) -> list[BrokerNode]:
    """Every node with a listener in ``/api/overview``, sorted by name."""
    listeners: dict[str, dict[str, Address]] = {}
    for item in overview.get("listeners", []):
        node = str(item["node"])
        ip = str(item.get("ip_address", ""))
        host = node_host(node) if ip in _ANY else ip
        listeners.setdefault(node, {})[str(item["protocol"])] = Address(host, int(item["port"]))
    return [BrokerNode(name, listeners[name]) for name in sorted(listeners)]


def pick_node(nodes: Iterable[BrokerNode], wanted: str) -> BrokerNode:
    """The node called ``wanted`` (full name, or the part before ``@``)."""
    nodes = list(nodes)
    for node in nodes:
        if wanted in (node.name, node.short):
            return node
    raise NoCandidateNode(f"no node named {wanted!r} in the cluster (nodes: {', '.join(n.name for n in nodes)})")


def evenly_spread(counts: Mapping[str, int], nodes: Sequence[str], total: int, tolerance: float) -> bool:
    """Are all ``total`` connections on ``nodes`` (every node with some), max/min at most ``tolerance``?"""
    values = [counts.get(n, 0) for n in nodes]
    if sum(values) < total or min(values) == 0:
        return False
    return max(values) / min(values) <= tolerance


def surplus(landed: Sequence[tuple[int, str | None]], nodes: Sequence[str], total: int) -> list[int]:
    """Which connections to move so that no node holds more than its share (``ceil(total / nodes)``):
    ``landed`` is ``(id, node)`` for each connection, in order; those on no node of ``nodes`` move too."""
    share = math.ceil(total / len(nodes))
    moving: list[int] = []
    seen: dict[str, int] = {}
    for ident, node in landed:
        if node is None or node not in nodes:
            moving.append(ident)
            continue
        seen[node] = seen.get(node, 0) + 1
        if seen[node] > share:
            moving.append(ident)
    return moving


def rebalance(
    landed: Sequence[tuple[int, str | None]], nodes: Sequence[str], total: int
) -> tuple[list[int], tuple[str, ...]]:
    """One round of evening out: the connections to move (:func:`surplus`), and the nodes they may go to:
    those below their share once the moving ones have left (every node of ``nodes`` if none is)."""
    moving = surplus(landed, nodes, total)
    share = math.ceil(total / len(nodes))
    gone = set(moving)
    staying = Counter(node for ident, node in landed if ident not in gone and node is not None)
    room = tuple(n for n in nodes if staying.get(n, 0) < share)
    return moving, room or tuple(nodes)


def rotated(items: Sequence[T], start: int) -> tuple[T, ...]:
    """``items`` in turn from position ``start`` (modulo their number), round to the one before it."""
    if not items:
        return ()
    k = start % len(items)
    return (*items[k:], *items[:k])


def spread_candidates(index: int, nodes: Sequence[Address], *, through_lb: bool, what: str = "fleet") -> Candidates:
    """Where connection ``index`` of a fleet over ``nodes`` may go.

    Directly: its own node (``index`` mod n, so the spread is exact), then, only when that one is out of
    reach, the others in turn from the next.  Through a load balancer: any of ``nodes`` (the balancer picks;
    :func:`rebalance` then evens the fleet out, and a landing on another node is a mismatch).

    :raises ConfigurationError: no nodes.
    """
    if not nodes:
        raise ConfigurationError(f"{what}: no node to spread over")
    if through_lb:
        return Candidates(f"{what} #{index}", Role.CONNECTION, (tuple(nodes),))
    order = rotated(nodes, index)
    tiers = (order[:1], order[1:]) if len(order) > 1 else (order,)
    return Candidates(f"{what} #{index}", Role.CONNECTION, tiers)


def reconnect_candidates(nodes: Sequence[Address], last: Address | None, what: str = "reconnect",
                         avoid: Collection[Address] = ()) -> Candidates:
    """Where a connection that dropped off ``last`` may go: every other node, in turn from the one after
    ``last`` (tier 0), then ``last`` itself (tier 1).  So a reconnect moves on, as a node that dropped a
    connection may be going away; it goes back only when no other node answers (directly), or when a load
    balancer never routes elsewhere (the kept landing there is the fallback).  With ``last`` not among
    ``nodes`` (or alone), any node.  The nodes in ``avoid`` (found cut off lately) go to the last tier too.

    :raises ConfigurationError: no nodes.
    """
    if not nodes:
        raise ConfigurationError(f"{what}: no node to reconnect to")
    if last is None or last not in nodes or len(nodes) == 1:
        first, later = [n for n in nodes if n not in avoid], [n for n in nodes if n in avoid]
    else:
        others = rotated(nodes, list(nodes).index(last) + 1)[:-1]
        first, later = [n for n in others if n not in avoid], [*(n for n in others if n in avoid), last]
    return Candidates(what, Role.CONNECTION, (tuple(first), tuple(later)) if first and later
                      else (tuple(first or later),))


@dataclass
class Unreachable:
    """The nodes a recovery could not reach just now (through a load balancer that no longer routes to a cut
    node), which :func:`queue_consumer_node` and :func:`queue_publisher_node` avoid: once every one of the queue's
    members failed, a new round starts with the last one tried last (``rounds`` counts them); once placed, none."""

    nodes: set[str] = field(default_factory=set)
    rounds: int = 0  #: rounds in which every member failed

    def failed(self, node: str, members: Sequence[str]) -> None:
        self.nodes.add(node)
        if self.nodes >= {*members, node}:
            self.nodes = {node}
            self.rounds += 1

    def placed(self) -> None:
        self.nodes.clear()


class LeftNodes:
    """The node a queue's publisher lost its connection on lately (within ``seconds``), per queue: a node cut off from
    its peers still names itself the queue's leader to a look-up that reaches it, so the queue's next publishers (a
    recovery, a new publisher the application makes, a leader check) go to another member first until then."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self._clock = seconds, clock
        self._left: dict[str, tuple[str, float]] = {}

    def add(self, queue: str, node: str) -> None:
        self._left[queue] = (node, self._clock())

    def recent(self, queue: str) -> str | None:
        """The node ``queue``'s publisher left less than ``seconds`` ago, if any."""
        entry = self._left.get(queue)
        if entry is None:
            return None
        if self._clock() - entry[1] >= self.seconds:
            if self._left.get(queue) is entry:  # (not one another thread added meanwhile)
                self._left.pop(queue, None)
            return None
        return entry[0]


class CutOffNodes:
    """The nodes found cut off lately (within ``seconds``): a node that still answers its clients while its queues
    take nothing (a partition's minority: AMQP 0.9.1's queue watch, MQTT's PUBACK watch), or whose link went silent
    under a write (an AMQP 1.0 publish timed out).  One per Environment, shared by its wings: a consumer there hears
    nothing, yet its link looks alive, so each wing ends its connections on such a node that it placed before the
    finding (:meth:`ends`: they recover elsewhere) and places new ones elsewhere first (:meth:`avoided`).  A finding
    within ``seconds`` of the first is the same one (the connections it ended find it again as they go): the time is
    the first's, so a connection placed there since (the only node left, say) is not ended for it.  Thread-safe (a
    lock): each wing reads it from its own threads."""

    def __init__(self, seconds: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self._clock = seconds, clock
        self._found: dict[str, tuple[float, str]] = {}  # node -> (when, by what)
        self._lock = threading.Lock()

    def found(self, node: str | None, by: str) -> bool:
        """``by`` (what found it: "the queue watch of AMQP connection X") found ``node`` cut off; True if this is a
        new finding (none within ``seconds``).  None (a node not known) is nothing."""
        if node is None:
            return False
        with self._lock:
            if self._recent(node) is not None:
                return False
            self._found[node] = (self._clock(), by)
            return True

    def ends(self, node: str | None, placed_at: float) -> str | None:
        """Why a connection placed on ``node`` at ``placed_at`` (this clock) is to end: what found the node cut off
        after it was placed there; None if nothing did (or not lately).  Asked on the deliver path (an AMQP 1.0
        consumer after each pass, MQTT's loop): with nothing found, no lock is taken."""
        if node is None or not self._found:
            return None
        with self._lock:
            entry = self._recent(node)
        return entry[1] if entry is not None and entry[0] > placed_at else None

    def any_after(self, placed_at: float) -> str | None:
        """What found a node cut off after ``placed_at``, for a connection whose node is not known (it may be that
        one: a reconnect through a load balancer kept its first landing unnamed); None if nothing did lately."""
        if not self._found:  # (as for ends: the usual answer, without the lock)
            return None
        with self._lock:
            found = [entry for node in list(self._found) if (entry := self._recent(node)) is not None
                     and entry[0] > placed_at]
        return max(found)[1] if found else None

    def avoided(self) -> set[str]:
        """The nodes found cut off lately: new connections go elsewhere first."""
        with self._lock:
            return {node for node in list(self._found) if self._recent(node) is not None}

    def _recent(self, node: str) -> tuple[float, str] | None:  # (under the lock)
        entry = self._found.get(node)
        if entry is None or self._clock() - entry[0] < self.seconds:
            return entry
        del self._found[node]
        return None


def queue_publisher_node(queue: str, leader: str | None, members: Sequence[str], used: Mapping[str, int],
                         avoid: Collection[str] = ()) -> str:
    """The node a publisher to a queue goes to: its leader (the writes go there), or, when the client could not
    reach it just now (``avoid``: through a load balancer that no longer routes to a cut node), the least used
    member it did not fail to reach (the broker forwards the writes to the leader); the leader again when every
    member is in ``avoid``.

    :raises TopologyError: the queue has no leader now.
    """
    if leader is None:
        raise TopologyError(f"queue {queue!r} has no leader now")
    if leader not in avoid:
        return leader
    others = [m for m in members if m not in avoid]
    return min(others, key=lambda member: (used.get(member, 0), member)) if others else leader


def queue_consumer_node(queue: str, leader: str | None, members: Sequence[str], prefer: str,
                        used: Mapping[str, int], avoid: Collection[str] = ()) -> str:
    """The node a consumer of a queue goes to: its leader (``prefer="leader"``), a member that is not the leader
    (``"replica"``; the leader when there is no other), or any member (``"member"``); among several, the one with
    the fewest of this client's connections (``used``), then by name.  Not one of ``avoid`` (nodes the client could
    not reach just now: through a load balancer that no longer routes to a cut node, a recovery would ask for it
    again and again) while another member will do: a preferred one first, then any (every member serves the
    queue); one of the preferred when every member is in ``avoid``.

    :raises NoCandidateNode: the queue has no member.  :raises TopologyError: no leader now, for ``"leader"``.
    """
    candidates = list(members) or ([leader] if leader else [])
    if not candidates:
        raise NoCandidateNode(f"queue {queue!r} has no member to consume from")
    if prefer == "leader" and leader is None:
        raise TopologyError(f"queue {queue!r} has no leader now")
    preferred: list[str] = ([leader] if prefer == "leader" and leader else
                 [m for m in candidates if m != leader] or candidates if prefer == "replica" else candidates)
    reachable = ([m for m in preferred if m not in avoid] or [m for m in candidates if m not in avoid]
                 or preferred)
    return min(reachable, key=lambda member: (used.get(member, 0), member))


def any_node_tiers(addresses: Mapping[T, str], avoid: Collection[str]) -> tuple[tuple[T, ...], ...]:
    """The tiers of a connection to any node (``addresses``: each node's address -> its name): the nodes not in
    ``avoid`` first, the avoided ones only as the fallback (a node found cut off from its queues' leaders); one
    tier when either part is empty."""
    first = tuple(a for a, name in addresses.items() if name not in avoid)
    later = tuple(a for a in addresses if a not in first)
    return (first, later) if first and later else (tuple(addresses),)

