"""Every runnable example runs against the test bed and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from smartclient.testing import TestBed

ROOT = Path(__file__).resolve().parents[2]
#: every example runs with deprecation warnings as errors: what a user copies from one uses only current API
PYTHON = (sys.executable, "-W", "error::DeprecationWarning")


def test_quickstart_places_through_the_lb(rabbitmq_testbed: TestBed) -> None:
    host, port = rabbitmq_testbed.lb("stream")
    env = {**os.environ, "SMARTCLIENT_URI": rabbitmq_testbed.stream_uri(host, port)}
    proc = subprocess.run([*PYTHON, str(ROOT / "examples" / "quickstart.py")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "placement OK" in proc.stdout
    assert proc.stdout.count(f"127.0.0.1:{port}") >= 3  # every connection dialled the LB


RUNNABLE = sorted(p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("test_"))
#: examples whose every step a test of their own runs (each main only calls those steps in turn), on the suite's
#: shared Spark session: their main starts a Spark JVM of its own, 60-80 s on a loaded CI machine
RUN_ELSEWHERE = {
    "iot_ingest.py": "its setup, devices, Spark aggregation, reads and check run in tests/integration/test_mqtt.py::"
                     "test_iot_example_devices_to_stream_to_spark_to_stream (on the shared Spark session)",
    "spark_connect.py": "its publish, query (run, then its last batch again) and read run in tests/integration/"
                        "test_spark_connect.py::test_the_connect_example_reads_transforms_and_writes_back_exactly_once "
                        "(on the suite's Connect server)",
    "spark_foreach_batch.py": "its publish, pipeline and read run in tests/integration/test_spark.py::test_end_to_end_"
                         "source_transform_sink_through_the_lb (on the shared Spark session), and on the standalone "
                         "cluster in tests/integration/test_spark_cluster.py",
}


def test_each_example_run_elsewhere_names_tests_that_exist() -> None:
    """The examples left out below are run step by step by the tests each names: those tests must exist."""
    import re

    for example, where in RUN_ELSEWHERE.items():
        assert (ROOT / "examples" / example).exists(), example
        for path, name in re.findall(r"(tests/integration/\w+\.py)(?:::(\w+))?", where):
            source = (ROOT / path).read_text()
            assert not name or f"def {name}(" in source, f"{example}: {path}::{name} does not exist"


@pytest.mark.parametrize("example", [e for e in RUNNABLE if e not in RUN_ELSEWHERE])
def test_every_example_runs_against_the_test_bed(rabbitmq_testbed: TestBed, example: str) -> None:
    """Each example's own main, as a user would run it (the test bed's default addresses)."""
    host, port = rabbitmq_testbed.lb("stream")
    mqtt_host, mqtt_port = rabbitmq_testbed.lb("mqtt")
    env = {**os.environ, "SMARTCLIENT_URI": rabbitmq_testbed.stream_uri(host, port),
           "SMARTCLIENT_MQTT_LB": f"{mqtt_host}:{mqtt_port}",
           "SMARTCLIENT_MANAGEMENT": rabbitmq_testbed.nodes[0].management_url}
    proc = subprocess.run([*PYTHON, str(ROOT / "examples" / example)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"{example} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
