"""pytest fixtures for tests against a real RabbitMQ cluster, load balancer and DNS server.

Opt-in: nothing loads unless a test suite asks for it.  Install
``smartclient[testbed]``, then enable the plugin in one of these ways::

    pytest -p smartclient.testing.pytest_plugin     # or the short form: -p smartclient.testing
    # or, in the root conftest.py of the suite:
    pytest_plugins = ["smartclient.testing.pytest_plugin"]

Every fixture carries the ``rabbitmq_`` prefix, so none collides with a fixture of your own:

* ``rabbitmq_testbed`` (session): the local test bed, brought up once (idempotent), or
  the external cluster named by ``SMARTCLIENT_TESTBED_EXTERNAL``;
* ``rabbitmq_faulty_testbed``: the same, healed after the test, for tests that inject faults;
* ``rabbitmq_unique_name``: a stream/queue name unique to the test;
* ``rabbitmq_spark`` (session): one local Spark session (needs ``smartclient[spark]`` and Java 17).

A test that needs a feature of a newer RabbitMQ line says so with ``@pytest.mark.requires_rabbitmq("4.3")``:
on an older test bed it is skipped, and the reason names both versions.

A fault the test bed cannot inject (``FaultUnavailable``) skips the test and
says why; a missing prerequisite fails with one sentence, not a stack trace.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from smartclient._errors import FaultUnavailable, PrerequisiteMissing
from smartclient.testing import from_env
from smartclient.testing.local import LocalTestBed
from smartclient.testing.testbed import TestBed


@pytest.fixture(scope="session")
def rabbitmq_testbed() -> TestBed:
    """The running test bed: the local one, brought up once per session, or the external one."""
    try:
        bed = from_env()
        if isinstance(bed, LocalTestBed):
            bed.up()
    except PrerequisiteMissing as exc:
        pytest.fail(f"the smartclient test bed cannot start: {exc}", pytrace=False)
    return bed


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires_rabbitmq(version): skip unless the test bed runs this RabbitMQ version or later")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@pytest.fixture(autouse=True)
def _rabbitmq_requires_version(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("requires_rabbitmq")
    if marker is None:
        return
    wanted = str(marker.args[0])
    bed: TestBed = request.getfixturevalue("rabbitmq_testbed")
    running = bed.rabbitmq_version()
    if _version_tuple(running) < _version_tuple(wanted):
        why = marker.kwargs.get("reason", "")
        pytest.skip(f"needs RabbitMQ {wanted} or later{f' ({why})' if why else ''}; the test bed runs {running}")


@pytest.fixture
def rabbitmq_faulty_testbed(rabbitmq_testbed: TestBed) -> Iterator[TestBed]:
    """The test bed, for a test that injects faults: ``heal()`` undoes them after the test."""
    yield rabbitmq_testbed
    rabbitmq_testbed.heal()


@pytest.fixture(scope="session")
def rabbitmq_spark() -> Iterator[Any]:
    """One local Spark session for the whole test session (``local[2,4]``: 2 cores, tasks retried up
    to 4 times), with the Python of this interpreter on the executors."""
    from smartclient.testing.prerequisites import require_java

    try:
        require_java(17)
        from smartclient.spark.session import local_session
    except PrerequisiteMissing as exc:
        pytest.fail(f"Spark cannot start: {exc}", pytrace=False)
    except ImportError:
        pytest.fail("Spark cannot start: pyspark is not installed (pip install 'smartclient[spark]')",
                    pytrace=False)
    session = local_session("local[2,4]", "smartclient-tests", log_level="WARN", spark_driver_memory="1g")
    yield session
    session.stop()


@pytest.fixture
def rabbitmq_unique_name(request: pytest.FixtureRequest) -> str:
    """A stream or queue name unique to the test: ``sc-<test name>-<6 hex digits>``."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:40]
    return f"sc-{base}-{uuid.uuid4().hex[:6]}"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[Any]:
    try:
        return (yield)
    except FaultUnavailable as exc:
        pytest.skip(str(exc))
