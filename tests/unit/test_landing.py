"""The connect / check / keep-or-retry state machine, driven by simulated load balancers."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator

import pytest

from smartclient import Address, ConfigurationError, NodeUnreachable, PlacementError, RetryPolicy, StreamTopology
from smartclient.core.landing import Decision, GiveUp, Landing, UseFallback, Wait
from smartclient.core.topology import PlacementPolicy

N1, N2, N3 = (Address(f"n{i}", 5552) for i in (1, 2, 3))
LB = Address("lb", 5552)
TOPO = StreamTopology("s", N1, (N2, N3))


def drive(landing: Landing, lb: Iterator[Address]) -> tuple[Address, int]:
    """Run the machine against a simulated LB until it accepts; return the node and connections used."""
    while True:
        target = landing.next_target()
        node = next(lb)
        if landing.landed(target, LB, node) is Decision.ACCEPT:
            return node, len(landing.attempts)
        step = landing.next_step()
        if isinstance(step, UseFallback):
            return step.nodes[0], len(landing.attempts)
        if isinstance(step, GiveUp):
            raise step.error
        assert isinstance(step, Wait) and step.seconds == 0  # wrong landings never sleep


def test_round_robin_reaches_the_leader_within_one_cycle() -> None:
    for start in range(3):
        rr = itertools.islice(itertools.cycle([N1, N2, N3]), start, None)
        node, used = drive(Landing(TOPO.producer_candidates(), RetryPolicy()), rr)
        assert node == N1 and used <= 3


def test_consumer_accepts_any_least_loaded_replica_but_not_the_leader_first() -> None:
    node, used = drive(Landing(TOPO.consumer_candidates(), RetryPolicy()), iter([N1, N3, N2]))
    assert node == N3 and used == 2


def test_random_lb_places_within_the_caps() -> None:
    rng = random.Random(7)
    for _ in range(200):
        lb = iter(lambda: rng.choice([N1, N2, N3]), None)
        node, _ = drive(Landing(TOPO.producer_candidates(), RetryPolicy()), lb)
        assert node == N1


def test_sticky_lb_fails_fast_with_every_attempt_listed() -> None:
    landing = Landing(TOPO.producer_candidates(), RetryPolicy(sticky_window=5))
    with pytest.raises(NodeUnreachable) as info:
        drive(landing, itertools.repeat(N2))
    message = str(info.value)
    assert "reached only n2:5552" in message and "{n1:5552}" in message
    assert len(info.value.attempts) == 6  # the first landing is a new node; then 5 with nothing new
    assert all("not a candidate" in str(a) for a in info.value.attempts)


def test_repeated_attempts_are_summarised_with_a_count() -> None:
    landing = Landing(TOPO.producer_candidates(), RetryPolicy(sticky_window=20))
    with pytest.raises(NodeUnreachable) as info:
        drive(landing, itertools.repeat(N2))
    message = str(info.value)
    assert len(info.value.attempts) == 21  # every attempt is still there, for code that reads them
    assert message.count("dialled lb:5552 for n1:5552: reached n2:5552") == 1
    assert "21x dialled lb:5552 for n1:5552: reached n2:5552" in message
    assert len(message) < 600, message


def test_sticky_lb_on_the_leader_gives_consumers_the_fallback() -> None:
    node, used = drive(Landing(TOPO.consumer_candidates(), RetryPolicy(sticky_window=4)), itertools.repeat(N1))
    assert node == N1 and used == 5


def test_forced_replicas_never_fall_back_to_the_leader() -> None:
    cands = TOPO.consumer_candidates(PlacementPolicy(force_replica_for_consumers=True))
    with pytest.raises(NodeUnreachable):
        drive(Landing(cands, RetryPolicy(sticky_window=3)), itertools.repeat(N1))


def test_direct_mode_moves_to_the_next_tier_once_the_first_failed() -> None:
    landing = Landing(StreamTopology("s", N1, (N2,)).consumer_candidates(), RetryPolicy())
    assert landing.next_target() == N2
    landing.failed(N2, N2, ConnectionRefusedError("down"))
    assert isinstance(landing.next_step(), Wait)
    assert landing.next_target() == N1  # the leader is the fallback
    assert landing.landed(N1, N1, N1) is Decision.ACCEPT


def test_failures_back_off_and_are_capped_by_attempts() -> None:
    landing = Landing(TOPO.producer_candidates(), RetryPolicy(max_attempts=3, backoff_initial=0.1))
    delays = []
    for _ in range(3):
        landing.failed(landing.next_target(), None, ConnectionRefusedError("refused"))
        step = landing.next_step()
        if isinstance(step, Wait):
            delays.append(step.seconds)
    assert delays == [0.1, 0.2]
    assert isinstance(step, GiveUp) and type(step.error) is PlacementError
    assert "ConnectionRefusedError" in str(step.error)


def test_total_time_is_capped() -> None:
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    landing = Landing(TOPO.producer_candidates(), RetryPolicy(max_time=2.0), clock=clock)
    landing.landed(landing.next_target(), LB, N2)
    now[0] = 2.5
    assert isinstance(landing.next_step(), GiveUp)


@pytest.mark.parametrize("kwargs", [
    {"max_attempts": 0}, {"max_time": 0}, {"sticky_window": 1}, {"backoff_initial": 2, "backoff_max": 1},
])
def test_retry_policy_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_backoff_grows_and_caps() -> None:
    policy = RetryPolicy(backoff_initial=0.05, backoff_max=0.3)
    assert [policy.backoff(n) for n in range(5)] == [0.0, 0.05, 0.1, 0.2, 0.3]


def test_giving_up_chains_the_last_failure_as_its_cause() -> None:
    landing = Landing(TOPO.producer_candidates(), RetryPolicy(max_attempts=2))
    cause = ConnectionError("refused")
    landing.failed(N1, N1, cause)
    landing.failed(N1, N1, cause)
    step = landing.next_step()
    assert isinstance(step, GiveUp) and step.error.__cause__ is cause


def test_the_fallbacks_offered_are_every_candidate_reached_the_latest_first_in_its_tier() -> None:
    # a consumer's tiers: the replicas N2, N3, then the leader N1; an LB that sends it to N1 only
    landing = Landing(TOPO.consumer_candidates(), RetryPolicy(sticky_window=3))
    for _ in range(4):
        landing.landed(landing.next_target(), LB, N1)
    step = landing.next_step()
    assert isinstance(step, UseFallback) and step.nodes == (N1,)
    # two nodes of one later tier: a client that holds one connection at a time holds the latest
    cands = StreamTopology("s", N1, (N2,)).producer_candidates()  # the leader N1; then N2 (its fallback tier)
    landing = Landing(type(cands)("s", cands.role, ((N1,), (N2, N3))), RetryPolicy(sticky_window=3))
    for node in (N2, N3, N2, N3, N2):  # two new nodes, then three landings that reach none: sticky
        landing.landed(landing.next_target(), LB, node)
    step = landing.next_step()
    assert isinstance(step, UseFallback) and step.nodes == (N2, N3)


def test_with_a_fallback_kept_no_attempt_is_made_that_could_not_end_in_time() -> None:
    now = [0.0]
    landing = Landing(TOPO.consumer_candidates(), RetryPolicy(max_time=10.0, sticky_window=9), clock=lambda: now[0])
    landing.next_target()
    now[0] = 4.0  # an attempt takes 4 s (through an LB, waiting for the management API to list the connection)
    landing.landed(N2, LB, N1)  # the leader: a later tier, kept
    assert landing.longest == 4.0 and isinstance(landing.next_step(), Wait)  # 4 + 4 <= 10: one more
    landing.next_target()
    now[0] = 8.0
    landing.landed(N2, LB, N1)
    step = landing.next_step()  # 8 + 4 > 10: that one would end too late, so the kept one now
    assert isinstance(step, UseFallback) and step.nodes == (N1,)


def test_a_client_that_holds_one_connection_dials_again_only_with_time_for_two_more_attempts() -> None:
    now = [0.0]
    landing = Landing(TOPO.consumer_candidates(), RetryPolicy(max_time=15.0, sticky_window=9), clock=lambda: now[0],
                      holds_one=True)
    landing.next_target()
    now[0] = 4.0
    landing.landed(N2, LB, N1)  # kept (a later tier), and given up by the next dial
    assert isinstance(landing.next_step(), Wait)  # 4 + 2 x 4 <= 15: it may miss once and still dial again
    landing.next_target()
    now[0] = 8.0
    landing.landed(N2, LB, N1)
    step = landing.next_step()  # 8 + 2 x 4 > 15: a miss now would leave it nothing; the one it holds, then
    assert isinstance(step, UseFallback) and step.nodes == (N1,)
