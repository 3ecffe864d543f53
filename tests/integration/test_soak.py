"""Three minutes of the soak in CI: the nemesis's whole workload and its randomized mixed faults (a fixed seed),
plus one rolling restart (stop_app and a full restart in turn), connection churn, 60 s tokens and a client
certificate rotation, with the resources accounted.  The checker must find nothing confirmed lost, nothing
duplicated, every consumer gap-free, no message twice to the tracked one, and every resource flat.

This is also CI's nemesis run (issue 18's three-minute test ran the same workload and schedule alone): the
longer runs are ``bench/nemesis.py`` and ``bench/soak.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartclient.testing import TestBed
from smartclient.testing.nemesis import LOOPBACK_FAULTS, schedule
from smartclient.testing.soak import SoakPlan, soak

SEED = 18


@pytest.mark.faults
async def test_three_minutes_of_soak_with_a_rolling_restart_lose_nothing_and_leak_nothing(
    rabbitmq_faulty_testbed: TestBed, tmp_path: Path
) -> None:
    bed = rabbitmq_faulty_testbed
    # the baseline comes before the rollout, which is judged after it; RSS is judged over 2.5 of the 3 minutes
    # here (within 10 %: the first minutes still grow); bench/soak.py judges it over 44 (within 5 %)
    # (the nemesis's faults stop 50 s before the end: the rollout's window, from 20 s after it, is judged quiet)
    plan = SoakPlan(minutes=3.0, seed=SEED, first_rollout=60.0, warmup=30.0, certificate_every=60.0,
                    faults=LOOPBACK_FAULTS, fault_gap=(3.0, 8.0), rate=120.0, rss_growth=0.10, quiet=50.0,
                    amqp10=True)  # the AMQP 1.0 publisher and consumer too (every stage installs the extra)
    kinds = {f.what for f in schedule(plan.nemesis(), [n.name for n in bed.nodes], ["s0", "s1", "s2"])}
    assert {"kill", "stop_app", "move_leader"} <= kinds  # the seed covers the node faults and a leader move
    result = await soak(bed, plan, tmp_path / "soak.jsonl", progress=print)
    print(result.summary())
    report = result.report
    assert report.lost == 0 and report.duplicated == 0 and report.consumer_gaps == 0, result.summary()
    assert report.ok, result.summary()
    # a tracked consumer resumes after the last message it handed over: never a message twice
    assert report.consumers["c-tracked"].duplicates == 0, result.summary()
    assert sum(p.confirmed for p in report.producers.values()) > 10_000
    assert report.faults["roll"] == len(bed.nodes) and len(result.rollouts) == 1  # one rolling restart, every node
    assert report.ops_ok["rpc"] > 0 and report.ops_ok["mqtt"] > 0 and report.ops_ok["churn"] > 0
    assert report.ops_ok["churn-stream"] > 0 and report.ops_ok["churn-super"] > 0
    assert report.producers["p-token"].confirmed > 0 and report.consumers["c-token"].delivered > 0
    assert report.producers["amqp10-p"].confirmed > 0  # every confirmed one received: report.lost above
    assert result.resources.samples >= 10 and not result.resources.unjudged, result.summary()
    # what must be back after the rollout in 3 minutes: the tables kept per handle, stream, placement and
    # recovery, descriptors (none left half-closed), tasks, threads and connections.  Printed, not asserted here:
    # RSS over 3 minutes (bench/soak.py judges it over 44), and the totals per stream that follow the streams that
    # exist (a churn cycle cut by a fault may leave its stream behind)
    exact = {"handles", "placement records", "placement locks", "recovery keys", "recoveries under way",
             "connection ids in use", "client streams", "producer carrier streams", "consumer carrier streams",
             "producer carrier publishers", "consumer carrier subscribers", "metadata cache entries",
             "parked connections past their idle time", "committed-chunk cache entries",
             "consumer carrier counts of streams it no longer consumes",
             "threads", "asyncio tasks", "connections", "file descriptors", "half-closed sockets"}
    assert not set(result.resources.not_back) & exact, result.summary()
