"""The test bed's pytest plugin is opt-in: a project that installs smartclient gets no fixture until it asks,
and then gets them under the ``rabbitmq_`` prefix.  Each case runs pytest on a small project of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

USES_THE_BED = '''
from smartclient import FaultUnavailable


def test_the_bed(rabbitmq_testbed, rabbitmq_faulty_testbed, rabbitmq_unique_name):
    assert len(rabbitmq_testbed.nodes) >= 1 and rabbitmq_faulty_testbed is rabbitmq_testbed
    assert rabbitmq_unique_name.startswith("sc-test-the-bed-")


def test_a_fault_it_cannot_inject_is_a_skip():
    raise FaultUnavailable("this test bed cannot do that")
'''


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)


def test_installed_is_not_enabled(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(USES_THE_BED)
    out = run_pytest(tmp_path)
    assert "fixture 'rabbitmq_testbed' not found" in out.stdout, out.stdout + out.stderr
    listed = run_pytest(tmp_path, "--fixtures").stdout
    assert not [name for name in ("rabbitmq_", "testbed", "unique_name", "spark") if name in listed], listed


@pytest.mark.parametrize("how", ["-p smartclient.testing", "-p smartclient.testing.pytest_plugin", "conftest"])
def test_enabled_it_gives_the_prefixed_fixtures_and_skips_what_the_bed_cannot_do(tmp_path: Path, how: str) -> None:
    (tmp_path / "test_mine.py").write_text(USES_THE_BED)
    if how == "conftest":
        (tmp_path / "conftest.py").write_text('pytest_plugins = ["smartclient.testing.pytest_plugin"]\n')
        args: list[str] = []
    else:
        args = how.split()
    out = run_pytest(tmp_path, *args)
    assert out.returncode == 0 and "1 passed, 1 skipped" in out.stdout, out.stdout + out.stderr
    assert "this test bed cannot do that" in out.stdout
