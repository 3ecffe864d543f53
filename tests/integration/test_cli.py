"""The smartclient command against the test bed: the tables say where connections land."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

ROOT = Path(__file__).resolve().parents[2]


def run(bed: TestBed, *args: str) -> subprocess.CompletedProcess[str]:
    host, port = bed.lb("stream")
    env = {**os.environ, "SMARTCLIENT_URI": bed.stream_uri(host, port), "COLUMNS": "140",
           "SMARTCLIENT_LB": f"{host}:{port}"}
    return subprocess.run([sys.executable, "-m", "smartclient.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)


async def test_topology_and_place_show_leader_replicas_and_where_clients_landed(
    testbed: TestBed, unique_name: str
) -> None:
    await create_stream_led_by(testbed, unique_name, 2)
    try:
        out = run(testbed, "topology", unique_name)
        assert out.returncode == 0, out.stderr
        nodes = {f"localhost:{n.stream_port}" for n in testbed.nodes}
        leader_lines = [line for line in out.stdout.splitlines() if " leader " in line]
        assert len(leader_lines) == 1 and any(n in leader_lines[0] for n in nodes), out.stdout
        assert out.stdout.count("replica") == 2 and out.stdout.count(testbed.lb("stream")[0]) >= 3
        placed = run(testbed, "place", unique_name)
        assert placed.returncode == 0, placed.stderr
        producer = next(line for line in placed.stdout.splitlines() if "producer" in line)
        consumer = next(line for line in placed.stdout.splitlines() if "consumer" in line)
        assert "yes" in producer and "yes" in consumer  # on the leader, on a replica, per its own topology
        landed = [next(n for n in nodes if n in line) for line in (producer, consumer)]
        assert landed[0] != landed[1]
    finally:
        await delete_streams(testbed, unique_name)


def test_probe_counts_nodes_and_warns_about_a_sticky_lb(testbed: TestBed) -> None:
    host, port = testbed.lb("stream")
    even = run(testbed, "probe", "--via", f"{host}:{port}", "-n", "9")
    assert even.returncode == 0, even.stderr
    assert all(f"localhost:{n.stream_port}" in even.stdout for n in testbed.nodes) and "sticky" not in even.stdout
    shost, sport = testbed.lb("stream", "source")
    sticky = run(testbed, "probe", "--via", f"{shost}:{sport}", "-n", "5")
    assert "100%" in sticky.stdout and "looks" in sticky.stdout and "sticky" in sticky.stdout


def test_errors_are_one_readable_line_and_bench_names_are_checked(testbed: TestBed) -> None:
    missing = run(testbed, "topology", "no-such-stream-here")
    assert missing.returncode == 1 and "StreamNotFound" in missing.stdout and "Traceback" not in missing.stderr
    bench = run(testbed, "bench", "no-such-bench")
    assert bench.returncode == 2 and "mqtt_fleet" in bench.stdout  # lists what there is
