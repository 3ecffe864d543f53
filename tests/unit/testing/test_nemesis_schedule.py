"""The nemesis schedule: reproducible from its seed, and it never takes two nodes away at once. No broker."""

from __future__ import annotations

import pytest

from smartclient import ConfigurationError
from smartclient.testing.nemesis import FAULTS, LOOPBACK_FAULTS, PARTITIONS, Plan, schedule

NODES = ["rabbit-1@localhost", "rabbit-2@localhost", "rabbit-3@localhost"]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    plan = Plan(minutes=10, seed=42)
    assert schedule(plan, NODES, ["a", "b"]) == schedule(plan, NODES, ["a", "b"])
    assert schedule(plan, NODES, ["a", "b"]) != schedule(Plan(minutes=10, seed=43), NODES, ["a", "b"])


def test_a_quorum_stays_up_and_everything_is_healed_before_the_end() -> None:
    for seed in range(50):
        plan = Plan(minutes=10, seed=seed)
        faults = schedule(plan, NODES, ["a"])
        down = [(f.at, f.at + f.hold) for f in faults if FAULTS[f.what]]
        for (_, end), (start, _) in zip(down, down[1:], strict=False):
            assert start > end, f"seed {seed}: two nodes down at once"
        assert all(f.at + f.hold < plan.minutes * 60 for f in faults)
        assert {f.what for f in faults} <= set(FAULTS)


def test_a_long_run_injects_every_kind_of_fault() -> None:
    faults = schedule(Plan(minutes=10, seed=3), NODES, ["a"])
    assert {f.what for f in faults} == set(LOOPBACK_FAULTS) and len(faults) > 50


def test_partitions_are_drawn_only_when_asked_and_each_takes_its_node_away_alone() -> None:
    plan = Plan(minutes=10, seed=5, kinds=(*LOOPBACK_FAULTS, *PARTITIONS))
    faults = schedule(plan, NODES, ["a"])
    assert {f.what for f in faults} == set(FAULTS)
    cuts = [f for f in faults if f.what in PARTITIONS]
    assert all(f.target in NODES and f.hold > 0 for f in cuts)
    down = [(f.at, f.at + f.hold) for f in faults if FAULTS[f.what]]
    assert all(start > end for (_, end), (start, _) in zip(down, down[1:], strict=False))


def test_a_plan_can_draw_from_some_faults_only() -> None:
    faults = schedule(Plan(minutes=10, seed=5, kinds=("kill", "lb_restart")), NODES, ["a"])
    assert {f.what for f in faults} == {"kill", "lb_restart"}
    only_kill = schedule(Plan(minutes=10, seed=5, kinds=("kill",)), NODES, ["a"])
    assert only_kill and all(f.what == "kill" for f in only_kill)
    assert all(b.at >= a.at + a.hold for a, b in zip(only_kill, only_kill[1:]))  # one node away at a time


def test_a_plan_with_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="not netsplit"):
        Plan(kinds=("kill", "netsplit"))
