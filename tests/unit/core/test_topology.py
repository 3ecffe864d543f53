"""Who may serve each role: the pure placement rules."""

import pytest

from smartclient import Address, ConfigurationError, NoCandidateNode, PlacementPolicy, Role, StreamTopology
from smartclient.core.topology import Candidates

L, R1, R2 = Address("n1", 5552), Address("n2", 5552), Address("n3", 5552)
TOPO = StreamTopology("s", L, (R1, R2))


def test_producers_go_to_the_leader_only_by_default() -> None:
    assert TOPO.producer_candidates().tiers == ((L,),)
    relaxed = TOPO.producer_candidates(PlacementPolicy(force_leader_for_producers=False))
    assert relaxed.tiers == ((L,), (R1, R2))


def test_consumers_prefer_replicas_then_the_leader() -> None:
    assert TOPO.consumer_candidates().tiers == ((R1, R2), (L,))
    forced = TOPO.consumer_candidates(PlacementPolicy(force_replica_for_consumers=True))
    assert forced.tiers == ((R1, R2),)


def test_consumers_spread_over_the_least_loaded_replicas() -> None:
    assert TOPO.consumer_candidates(load={R1: 1}).tiers == ((R2,), (R1,), (L,))
    assert TOPO.consumer_candidates(load={R1: 1, R2: 1}).tiers == ((R1, R2), (L,))


def test_no_replica() -> None:
    lonely = StreamTopology("s", L, ())
    assert lonely.consumer_candidates().tiers == ((L,),)
    with pytest.raises(NoCandidateNode, match="no replica online and replicas are forced"):
        lonely.consumer_candidates(PlacementPolicy(force_replica_for_consumers=True))


def test_candidates_helpers() -> None:
    c = TOPO.candidates(Role.CONSUMER)
    assert c.all == (R1, R2, L) and c.tier_of(L) == 1 and c.tier_of(Address("x", 1)) is None
    assert str(c) == "{n2:5552, n3:5552} > {n1:5552}"
    with pytest.raises(ConfigurationError, match="empty tier"):
        Candidates("s", Role.PRODUCER, ((),))
    with pytest.raises(ConfigurationError, match="also listed as a replica"):
        StreamTopology("s", L, (L,))


def test_how_long_a_placement_waits_for_replicas() -> None:
    from smartclient.core.topology import replica_wait

    lonely = StreamTopology("s", Address("n1", 1), ())
    full = StreamTopology("s", Address("n1", 1), (Address("n2", 1),))
    assert replica_wait(full, Role.CONSUMER, PlacementPolicy(), 15) == 0
    assert replica_wait(lonely, Role.PRODUCER, PlacementPolicy(), 15) == 0
    assert replica_wait(lonely, Role.CONSUMER, PlacementPolicy(), 15) == 1.0
    assert replica_wait(lonely, Role.CONSUMER, PlacementPolicy(force_replica_for_consumers=True), 15) == 15
    # recovering, a consumer that may fall back takes what can be read now (and moves back later)
    assert replica_wait(lonely, Role.CONSUMER, PlacementPolicy(), 15, recovering=True) == 0
    assert replica_wait(lonely, Role.CONSUMER, PlacementPolicy(force_replica_for_consumers=True), 15, True) == 15


def test_a_recovering_consumer_takes_the_first_choice_that_can_be_read() -> None:
    from smartclient.core.topology import ready_choice

    c = TOPO.consumer_candidates(load={R1: 1})  # {R2} > {R1} > {L}
    assert ready_choice(c, {R2, L}, 0.0, 0.25) == R2  # a first choice, at once
    assert ready_choice(c, {R1, L}, 0.1, 0.25) is None  # within the grace: the first choice is waited for
    assert ready_choice(c, {R1, L}, 0.3, 0.25) == R1  # then the next tiers, in order
    assert ready_choice(c, {L}, 0.3, 0.25) == L
    assert ready_choice(c, set(), 5.0, 0.25) is None
    assert ready_choice(TOPO.consumer_candidates(), {R2}, 0.0, 0.25) == R2  # any of the first tier, in its order


def test_a_members_own_candidates_are_that_member_alone() -> None:
    from smartclient import TopologyError

    assert TOPO.member_candidates(R1) == Candidates("s", Role.LOCATOR, ((R1,),))
    with pytest.raises(TopologyError, match="is not a member of stream 's'"):
        TOPO.member_candidates(Address("elsewhere", 1))


def test_a_consumer_is_on_a_fallback_when_not_on_a_replica() -> None:
    from smartclient.core.topology import consumer_fallback

    assert consumer_fallback(TOPO, L) and not consumer_fallback(TOPO, R1) and not consumer_fallback(TOPO, R2)
    assert consumer_fallback(StreamTopology("s", L, ()), L)  # no replica named yet (an election): still the leader
