"""The connect / check / keep-or-retry state machine (:class:`Placement`, one step vocabulary), driven by simulated
load balancers through the core's own sync driver."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator

import pytest

from smartclient import Address, ConfigurationError, NodeUnreachable, PlacementError, RetryPolicy, StreamTopology
from smartclient.core.landing import (
    Attempt,
    Dial,
    Done,
    GiveUp,
    Keep,
    KeptList,
    Missed,
    Placement,
    Reached,
    Reject,
    drive,
)
from smartclient.core.topology import Candidates, PlacementPolicy, Role

N1, N2, N3 = (Address(f"n{i}", 5552) for i in (1, 2, 3))
LB = Address("lb", 5552)
TOPO = StreamTopology("s", N1, (N2, N3))


class _Lb:
    """A shell whose every dial goes through a simulated load balancer: ``lb`` says which node each one reaches.
    A connection is the node it reached; kept ones wait in a :class:`KeptList` for the fallback."""

    def __init__(self, lb: Iterator[Address], kept: KeptList[Address]) -> None:
        self.lb, self.kept, self.slept = lb, kept, []

    def dial(self, target: Address) -> Reached[Address] | Missed:
        node = next(self.lb)
        return Reached(node, LB, node)

    def keep(self, step: Keep[Address]) -> None:
        self.kept.put(step.node, step.connection)

    def reject(self, step: Reject[Address]) -> None:
        raise AssertionError("nothing is routed by name here")

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def attempted(self, attempt: Attempt) -> None:
        pass


def placed(candidates: Candidates, policy: RetryPolicy, lb: Iterator[Address]) -> tuple[Address, int]:
    """Run a placement against a simulated LB to its end; return the node and the connections it used."""
    kept: KeptList[Address] = KeptList()
    plan = Placement(candidates, policy, kept)
    shell = _Lb(lb, kept)
    done = drive(plan, shell)
    assert shell.slept == []  # wrong landings never sleep
    return done.connection, plan.attempts


def test_round_robin_reaches_the_leader_within_one_cycle() -> None:
    for start in range(3):
        rr = itertools.islice(itertools.cycle([N1, N2, N3]), start, None)
        node, used = placed(TOPO.producer_candidates(), RetryPolicy(), rr)
        assert node == N1 and used <= 3


def test_consumer_accepts_any_least_loaded_replica_but_not_the_leader_first() -> None:
    node, used = placed(TOPO.consumer_candidates(), RetryPolicy(), iter([N1, N3, N2]))
    assert node == N3 and used == 2


def test_random_lb_places_within_the_caps() -> None:
    rng = random.Random(7)
    for _ in range(200):
        lb = iter(lambda: rng.choice([N1, N2, N3]), None)
        node, _ = placed(TOPO.producer_candidates(), RetryPolicy(), lb)
        assert node == N1


def test_sticky_lb_fails_fast_with_every_attempt_listed() -> None:
    with pytest.raises(NodeUnreachable) as info:
        placed(TOPO.producer_candidates(), RetryPolicy(sticky_window=5), itertools.repeat(N2))
    message = str(info.value)
    assert "reached only n2:5552" in message and "{n1:5552}" in message
    assert len(info.value.attempts) == 6  # the first landing is a new node; then 5 with nothing new
    assert all("not a candidate" in str(a) for a in info.value.attempts)


def test_repeated_attempts_are_summarised_with_a_count() -> None:
    with pytest.raises(NodeUnreachable) as info:
        placed(TOPO.producer_candidates(), RetryPolicy(sticky_window=20), itertools.repeat(N2))
    message = str(info.value)
    assert len(info.value.attempts) == 21  # every attempt is still there, for code that reads them
    assert message.count("dialled lb:5552 for n1:5552: reached n2:5552") == 1
    assert "21x dialled lb:5552 for n1:5552: reached n2:5552" in message
    assert len(message) < 600, message


def test_sticky_lb_on_the_leader_gives_consumers_the_fallback() -> None:
    node, used = placed(TOPO.consumer_candidates(), RetryPolicy(sticky_window=4), itertools.repeat(N1))
    assert node == N1 and used == 5


def test_forced_replicas_never_fall_back_to_the_leader() -> None:
    cands = TOPO.consumer_candidates(PlacementPolicy(force_replica_for_consumers=True))
    with pytest.raises(NodeUnreachable):
        placed(cands, RetryPolicy(sticky_window=3), itertools.repeat(N1))


def test_direct_mode_moves_to_the_next_tier_once_the_first_failed() -> None:
    plan: Placement[Address] = Placement(StreamTopology("s", N1, (N2,)).consumer_candidates(), RetryPolicy())
    assert plan.start() == Dial(N2)
    step = plan.failed(N2, N2, ConnectionRefusedError("down"))
    assert isinstance(step, Dial) and step.target == N1  # the leader is the fallback
    assert plan.landed(N1, N1, N1, N1) == Done(N1)


def test_failures_back_off_and_are_capped_by_attempts() -> None:
    plan: Placement[Address] = Placement(TOPO.producer_candidates(), RetryPolicy(max_attempts=3,
                                                                                 backoff_initial=0.1,
                                                                                 backoff_jitter=0.0))
    delays = []
    step = plan.start()
    for _ in range(3):
        assert isinstance(step, Dial)
        step = plan.failed(step.target, None, ConnectionRefusedError("refused"))
        if isinstance(step, Dial):
            delays.append(step.delay)
    assert delays == [0.1, 0.2]
    assert isinstance(step, GiveUp) and type(step.error) is PlacementError
    assert "ConnectionRefusedError" in str(step.error)


def test_total_time_is_capped() -> None:
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    plan: Placement[Address] = Placement(TOPO.producer_candidates(), RetryPolicy(max_time=2.0), clock=clock)
    plan.start()
    now[0] = 2.5
    assert isinstance(plan.landed(N1, LB, N2, N2), Keep) and isinstance(plan.next(), GiveUp)


@pytest.mark.parametrize("kwargs", [
    {"max_attempts": 0}, {"max_time": 0}, {"sticky_window": 1}, {"backoff_initial": 2, "backoff_max": 1},
])
def test_retry_policy_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_backoff_grows_and_caps() -> None:
    policy = RetryPolicy(backoff_initial=0.05, backoff_max=0.3, backoff_jitter=0.0)
    assert [policy.backoff(n) for n in range(5)] == [0.0, 0.05, 0.1, 0.2, 0.3]


def test_giving_up_chains_the_last_failure_as_its_cause() -> None:
    plan: Placement[Address] = Placement(TOPO.producer_candidates(), RetryPolicy(max_attempts=2))
    cause = ConnectionError("refused")
    plan.start()
    plan.failed(N1, N1, cause)
    step = plan.failed(N1, N1, cause)
    assert isinstance(step, GiveUp) and step.error.__cause__ is cause


class _Offered:
    """A kept-connection hook that records what each offer asked for and hands nothing (or ``node``'s)."""

    def __init__(self, node: Address | None = None) -> None:
        self.node, self.asked = node, []

    def take(self, nodes: tuple[Address, ...]) -> Address | None:
        self.asked.append(nodes)
        return self.node if self.node in nodes else None


def _land(plan: Placement[Address], *nodes: Address) -> object:
    step: object = plan.start()
    for node in nodes:
        assert isinstance(step, Dial)
        step = plan.landed(step.target, LB, node, node)
        if isinstance(step, Keep):
            step = plan.next()
    return step


def test_the_fallbacks_offered_are_every_candidate_reached_the_latest_first_in_its_tier() -> None:
    # a consumer's tiers: the replicas N2, N3, then the leader N1; an LB that sends it to N1 only
    kept = _Offered(N1)
    assert _land(Placement(TOPO.consumer_candidates(), RetryPolicy(sticky_window=3), kept), N1, N1, N1, N1) == \
        Done(N1, reused=True)
    assert (N1,) in kept.asked
    # two nodes of one later tier: a client that holds one connection at a time holds the latest
    cands = StreamTopology("s", N1, (N2,)).producer_candidates()
    kept = _Offered()
    plan = Placement(Candidates("s", cands.role, ((N1,), (N2, N3))), RetryPolicy(sticky_window=3), kept)
    assert isinstance(_land(plan, N2, N3, N2, N3, N2), GiveUp)  # two new nodes, then three that reach none
    assert (N2, N3) in kept.asked  # offered the latest first; it had none, so the placement gave up


def test_with_a_fallback_kept_no_attempt_is_made_that_could_not_end_in_time() -> None:
    now = [0.0]
    kept = _Offered(N1)
    plan = Placement(TOPO.consumer_candidates(), RetryPolicy(max_time=10.0, sticky_window=9), kept,
                     clock=lambda: now[0])
    target = plan.start()
    assert isinstance(target, Dial)
    now[0] = 4.0  # an attempt takes 4 s (through an LB, waiting for the management API to list the connection)
    assert isinstance(plan.landed(target.target, LB, N1, N1), Keep)  # the leader: a later tier, kept
    step = plan.next()
    assert plan.longest == 4.0 and isinstance(step, Dial)  # 4 + 4 <= 10: one more
    now[0] = 8.0
    assert isinstance(plan.landed(step.target, LB, N1, N1), Keep)
    assert plan.next() == Done(N1, reused=True)  # 8 + 4 > 10: that one would end too late, so the kept one now


def test_a_client_that_holds_one_connection_dials_again_only_with_time_for_two_more_attempts() -> None:
    now = [0.0]
    plan = Placement(TOPO.consumer_candidates(), RetryPolicy(max_time=15.0, sticky_window=9), _Offered(N1),
                     clock=lambda: now[0], holds_one=True)
    step = plan.start()
    assert isinstance(step, Dial)
    now[0] = 4.0
    assert isinstance(plan.landed(step.target, LB, N1, N1), Keep)  # kept (a later tier), given up by the next dial
    step = plan.next()
    assert isinstance(step, Dial)  # 4 + 2 x 4 <= 15: it may miss once and still dial again
    now[0] = 8.0
    assert isinstance(plan.landed(step.target, LB, N1, N1), Keep)
    assert plan.next() == Done(N1, reused=True)  # 8 + 2 x 4 > 15: a miss now would leave it nothing


def test_a_landing_whose_node_cannot_be_told_is_taken_only_where_any_node_will_do() -> None:
    """A reconnect (every node a candidate) takes a connection whose node the management API did not tell in time;
    a placement that needs a node it can name is told so by a typed error, never given an unknown node."""
    candidates = Candidates("s", Role.CONSUMER, ((N2, N3), (N1,)))

    class Untold:
        def __init__(self) -> None:
            self.dials = 0

        def dial(self, target: Address) -> Reached[str]:
            self.dials += 1
            return Reached("connection", LB, None)

        def keep(self, step: Keep[str]) -> None: ...

        def reject(self, step: Reject[str]) -> None: ...

        def sleep(self, seconds: float) -> None: ...

        def attempted(self, attempt: Attempt) -> None: ...

    shell = Untold()
    plan: Placement[str] = Placement(candidates, RetryPolicy(), untold_ok=True)
    assert drive(plan, shell) == Done("connection") and shell.dials == 1
    assert "reached a node, accepted: its node could not be told" in str(plan.history[-1])
    with pytest.raises(ValueError, match="whose node cannot be told"):
        drive(Placement(candidates, RetryPolicy()), Untold())
