"""A stream's topology, as the metadata command describes it, and who may serve each role.

Pure values: no I/O.  The leader and replicas are identified by their
*advertised* address (what the node says it is); where to dial each one is the
resolver's business and happens at one seam, in the connector.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum

from smartclient._errors import ConfigurationError, NoCandidateNode, TopologyError
from smartclient.core.address import Address
from smartclient.core.validation import flag

__all__ = [
    "Candidates",
    "PlacementPolicy",
    "Role",
    "StreamTopology",
    "TopologyNode",
    "consumer_fallback",
    "ready_choice",
    "replica_wait",
]


class Role(str, Enum):
    PRODUCER = "producer"
    CONSUMER = "consumer"
    LOCATOR = "locator"
    CONNECTION = "connection"  # an AMQP or MQTT connection placed on a node


@dataclass(frozen=True)
class PlacementPolicy:
    """Where producers and consumers may land (the Java client's two flags).

    :param force_leader_for_producers: producers only on the leader; if False, any member.
    :param force_replica_for_consumers: consumers only on replicas; if False the leader is the fallback.
    """

    force_leader_for_producers: bool = True
    force_replica_for_consumers: bool = False

    def __post_init__(self) -> None:
        flag("PlacementPolicy.force_leader_for_producers", self.force_leader_for_producers)
        flag("PlacementPolicy.force_replica_for_consumers", self.force_replica_for_consumers)


@dataclass(frozen=True)
class TopologyNode:
    """One member of a stream: the address it advertises, and the address the resolver dials for it
    (``dial`` is None, with ``error`` saying why, if resolution failed)."""

    role: str  # "leader" or "replica"
    advertised: Address
    dial: Address | None
    error: str | None = None


@dataclass(frozen=True)
class StreamTopology:
    """Leader and replicas of one stream, by advertised address, with when they were read.

    ``dial`` maps each member to its resolved, dialable address, when the Environment resolved them.
    """

    stream: str
    leader: Address
    replicas: tuple[Address, ...]
    read_at: float = field(default_factory=time.monotonic, compare=False)
    dial: Mapping[Address, Address | str] = field(default_factory=dict, compare=False)

    @property
    def nodes(self) -> tuple[TopologyNode, ...]:
        """Every member with its advertised and dialable address."""
        out = []
        for role, address in [("leader", self.leader), *(("replica", r) for r in self.replicas)]:
            resolved = self.dial.get(address)
            out.append(TopologyNode(role, address, resolved if isinstance(resolved, Address) else None,
                                    resolved if isinstance(resolved, str) else None))
        return tuple(out)

    def __post_init__(self) -> None:
        if self.leader in self.replicas:
            raise ConfigurationError(f"{self.stream}: the leader {self.leader} is also listed as a replica")

    @property
    def members(self) -> tuple[Address, ...]:
        return (self.leader, *self.replicas)

    def member_candidates(self, node: Address) -> Candidates:
        """Only ``node``, a member of the stream: to ask that member itself (its own view of the stream).

        :raises TopologyError: ``node`` is not a member."""
        if node not in self.members:
            raise TopologyError(f"{node} is not a member of stream {self.stream!r} (its members: "
                                f"{', '.join(map(str, self.members))})")
        return Candidates(self.stream, Role.LOCATOR, ((node,),))

    def producer_candidates(self, policy: PlacementPolicy = PlacementPolicy()) -> Candidates:
        """The leader; if the policy does not force it, the replicas as a fallback tier."""
        if policy.force_leader_for_producers or not self.replicas:
            return Candidates(self.stream, Role.PRODUCER, ((self.leader,),))
        return Candidates(self.stream, Role.PRODUCER, ((self.leader,), self.replicas))

    def consumer_candidates(
        self, policy: PlacementPolicy = PlacementPolicy(), load: Mapping[Address, int] | None = None
    ) -> Candidates:
        """Least-loaded replicas first, then the other replicas, then the leader unless replicas are forced.

        :raises NoCandidateNode: replicas are forced and the stream has none (yet).
        """
        counts = load or {}
        tiers: list[tuple[Address, ...]] = []
        if self.replicas:
            lowest = min(counts.get(a, 0) for a in self.replicas)
            tiers.append(tuple(sorted(a for a in self.replicas if counts.get(a, 0) == lowest)))
            rest = tuple(sorted(a for a in self.replicas if counts.get(a, 0) != lowest))
            if rest:
                tiers.append(rest)
        elif policy.force_replica_for_consumers:
            raise NoCandidateNode(
                f"stream {self.stream!r} has no replica online and replicas are forced for consumers "
                f"(leader {self.leader})"
            )
        if not policy.force_replica_for_consumers:
            tiers.append((self.leader,))
        return Candidates(self.stream, Role.CONSUMER, tuple(tiers))

    def candidates(
        self, role: Role, policy: PlacementPolicy = PlacementPolicy(), load: Mapping[Address, int] | None = None
    ) -> Candidates:
        if role is Role.PRODUCER:
            return self.producer_candidates(policy)
        if role is Role.CONSUMER:
            return self.consumer_candidates(policy, load)
        return Candidates(self.stream, role, (self.members,))


@dataclass(frozen=True)
class Candidates:
    """The nodes a placement accepts, in tiers: tier 0 is taken at once; a later tier only if tier 0 is
    out of reach.  Any node of any tier is *acceptable*; a node in no tier is a mismatch."""

    stream: str
    role: Role
    tiers: tuple[tuple[Address, ...], ...]
    #: narrowed to a node of a later tier than the first (see :func:`ready_choice`)
    fallback: bool = False

    def __post_init__(self) -> None:
        if not self.tiers or not all(self.tiers):
            raise ConfigurationError(f"placement of a {self.role.value} on {self.stream!r} has an empty tier")

    @property
    def all(self) -> tuple[Address, ...]:
        return tuple(a for tier in self.tiers for a in tier)

    def tier_of(self, node: Address) -> int | None:
        for index, tier in enumerate(self.tiers):
            if node in tier:
                return index
        return None

    def __str__(self) -> str:
        return " > ".join("{" + ", ".join(map(str, tier)) + "}" for tier in self.tiers)


def replica_wait(topology: StreamTopology, role: Role, policy: PlacementPolicy, max_time: float,
                 recovering: bool = False) -> float:
    """Seconds a placement should keep re-reading ``topology`` for replicas before it places: a new
    stream's replicas come up a moment after its leader.  A consumer that must have a replica waits up to
    the placement's time; one that may fall back to the leader waits a second, or, ``recovering``, not at all
    (after an election the replicas are named only once they have joined the new leader: a recovering consumer
    takes a member that can be read now, and moves back to a replica later); anything else not at all."""
    if role is not Role.CONSUMER or topology.replicas:
        return 0.0
    if policy.force_replica_for_consumers:
        return max_time
    return 0.0 if recovering else 1.0


def consumer_fallback(topology: StreamTopology, node: Address) -> bool:
    """Whether a consumer on ``node`` is off its first choice, and moves back once one can be read: it is not on a
    replica.  The leader is a consumer's last choice, also while no replica is named (after an election the
    replicas are named once they have joined the new leader); a more loaded replica is a first choice here."""
    return node not in topology.replicas


def ready_choice(candidates: Candidates, ready: Collection[Address], waited: float, grace: float) -> Address | None:
    """Where a recovering consumer goes, given the candidates' members known ``ready`` (able to be read) after
    ``waited`` seconds: the first ready node of the first tier at once; once ``grace`` seconds have passed with
    none of it ready, the first ready node of the next tiers, in order; None: wait on.

    After a restart or an election a member answers only once it has initialised (seconds, once 22.5 s), and a
    newly named leader's replicas join it one by one: waiting for the first choice alone kept consumers from
    messages their stream already took."""
    for index, tier in enumerate(candidates.tiers):
        if index and waited < grace:
            return None
        for node in tier:
            if node in ready:
                return node
    return None
