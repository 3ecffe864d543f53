"""The smartclient command against the test bed: the tables say where connections land."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from smartclient import FaultUnavailable
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

ROOT = Path(__file__).resolve().parents[2]


def run_cli(bed: TestBed, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the command with the test bed's URI and LB in SMARTCLIENT_URI and SMARTCLIENT_LB."""
    host, port = bed.lb("stream")
    return run_bare(*args, environ={"SMARTCLIENT_URI": bed.stream_uri(host, port), "SMARTCLIENT_LB": f"{host}:{port}"})


def run_bare(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command as a new user would: no SMARTCLIENT_* variable but those of ``environ``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMARTCLIENT_")} | {"COLUMNS": "140"}
    return subprocess.run([sys.executable, "-m", "smartclient.cli", *args], capture_output=True, text=True,
                          env=env | (environ or {}), timeout=120, cwd=ROOT)


def candidates(out: str, role: str) -> list[set[str]]:
    """The tiers ``place`` printed for ``role``: each a set of nodes, best first."""
    line = next(line for line in out.splitlines() if line.startswith(f"candidates of the {role}, tier by tier: "))
    return [set(tier.strip("{}").split(", ")) for tier in line.split(": ", 1)[1].split(" > ")]


def guest_only(bed: TestBed) -> None:
    if (bed.username, bed.password) != ("guest", "guest"):
        raise FaultUnavailable("this test bed's credentials are not guest/guest, the command's default")


async def test_topology_and_place_show_leader_replicas_and_where_clients_landed(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    await create_stream_led_by(rabbitmq_testbed, rabbitmq_unique_name, 2)
    try:
        out = run_cli(rabbitmq_testbed, "topology", rabbitmq_unique_name)
        assert out.returncode == 0, out.stderr
        nodes = {f"localhost:{n.stream_port}" for n in rabbitmq_testbed.nodes}
        leader_lines = [line for line in out.stdout.splitlines() if " leader " in line]
        assert len(leader_lines) == 1 and any(n in leader_lines[0] for n in nodes), out.stdout
        assert out.stdout.count("replica") == 2 and out.stdout.count(rabbitmq_testbed.lb("stream")[0]) >= 3
        placed = run_cli(rabbitmq_testbed, "place", rabbitmq_unique_name)
        assert placed.returncode == 0, placed.stderr
        producer = next(line for line in placed.stdout.splitlines() if "producer" in line)
        consumer = next(line for line in placed.stdout.splitlines() if "consumer" in line)
        assert "yes" in producer and "yes" in consumer  # on the leader, on a replica, per its own topology
        landed = [next(n for n in nodes if n in line) for line in (producer, consumer)]
        assert landed[0] != landed[1]
        # what was wanted is the Environment's own decision under the policy given (its candidates, by tier)
        leader = {f"localhost:{rabbitmq_testbed.nodes[2].stream_port}"}
        replicas = nodes - leader
        assert "policy: force_leader_for_producers=True, force_replica_for_consumers=False" in placed.stdout
        assert candidates(placed.stdout, "producer") == [leader]
        assert candidates(placed.stdout, "consumer") == [replicas, leader]
        other = run_cli(rabbitmq_testbed, "place", rabbitmq_unique_name, "--no-force-leader-for-producers",
                    "--force-replica-for-consumers")
        assert other.returncode == 0, other.stderr
        assert "policy: force_leader_for_producers=False, force_replica_for_consumers=True" in other.stdout
        assert candidates(other.stdout, "producer") == [leader, replicas]
        assert candidates(other.stdout, "consumer") == [replicas]
    finally:
        await delete_streams(rabbitmq_testbed, rabbitmq_unique_name)


def test_probe_counts_nodes_and_warns_about_a_sticky_lb(rabbitmq_testbed: TestBed) -> None:
    host, port = rabbitmq_testbed.lb("stream")
    even = run_cli(rabbitmq_testbed, "probe", "--via", f"{host}:{port}", "-n", "9")
    assert even.returncode == 0, even.stderr
    assert all(f"localhost:{n.stream_port}" in even.stdout for n in rabbitmq_testbed.nodes)
    assert "sticky" not in even.stdout
    shost, sport = rabbitmq_testbed.lb("stream", "source")
    sticky = run_cli(rabbitmq_testbed, "probe", "--via", f"{shost}:{sport}", "-n", "5")
    assert "100%" in sticky.stdout and "looks" in sticky.stdout and "sticky" in sticky.stdout


def test_probe_via_is_enough_on_its_own(rabbitmq_testbed: TestBed) -> None:
    """The README's ``smartclient probe --via my-lb:5552``: no --uri, no SMARTCLIENT_URI, no SMARTCLIENT_LB;
    the command dials the LB it was given, as guest/guest, and reports the nodes behind it."""
    guest_only(rabbitmq_testbed)
    host, port = rabbitmq_testbed.lb("stream")
    nodes = {f"localhost:{node.stream_port}" for node in rabbitmq_testbed.nodes}
    seen: set[str] = set()
    for _ in range(3):  # the LB is shared: other tests' sessions may take some round-robin turns
        out = run_bare("probe", "--via", f"{host}:{port}", "-n", "9")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"9 connections through {host}:{port}" in out.stdout
        assert "failed" not in out.stdout and "localhost:5552" not in out.stdout + out.stderr
        rows = [line.split("│")[1:3] for line in out.stdout.splitlines() if line.startswith("│")]
        assert {node.strip() for node, _ in rows} <= nodes and sum(int(n) for _, n in rows) == 9, out.stdout
        seen |= {node.strip() for node, _ in rows}
        if seen == nodes:
            break
    assert seen == nodes, out.stdout


async def test_topology_with_lb_alone_as_docs_sync_and_cli_shows(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """``smartclient topology STREAM --lb LB`` with no URI anywhere: the LB is the entry point too."""
    guest_only(rabbitmq_testbed)
    host, port = rabbitmq_testbed.lb("stream")
    await create_stream_led_by(rabbitmq_testbed, rabbitmq_unique_name, 0)
    try:
        out = run_bare("topology", rabbitmq_unique_name, "--lb", f"{host}:{port}")
        assert out.returncode == 0, out.stdout + out.stderr
        leader = next(line for line in out.stdout.splitlines() if " leader " in line)
        assert f"localhost:{rabbitmq_testbed.nodes[0].stream_port}" in leader and f"{host}:{port}" in leader
    finally:
        await delete_streams(rabbitmq_testbed, rabbitmq_unique_name)


def test_errors_are_one_readable_line_and_bench_names_are_checked(rabbitmq_testbed: TestBed) -> None:
    missing = run_cli(rabbitmq_testbed, "topology", "no-such-stream-here")
    assert missing.returncode == 1 and "StreamNotFound" in missing.stdout and "Traceback" not in missing.stderr
    bench = run_cli(rabbitmq_testbed, "bench", "no-such-bench")
    assert bench.returncode == 2 and "mqtt_fleet" in bench.stdout  # lists what there is
