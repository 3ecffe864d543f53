"""pytest fixtures for tests against a real RabbitMQ cluster, load balancer and DNS server.

Registered through the ``pytest11`` entry point, so any project that
installs ``smartclient[testbed]`` gets them:

* ``testbed`` (session): the local test bed, brought up once (idempotent), or
  the external cluster named by ``SMARTCLIENT_TESTBED_EXTERNAL``;
* ``faulty_testbed``: the same, healed after the test, for tests that inject faults;
* ``unique_name``: a stream/queue name unique to the test.

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
from smartclient.testing.testbed import TestBed


@pytest.fixture(scope="session")
def testbed() -> TestBed:
    from smartclient.testing.local import LocalTestBed
    from smartclient.testing.testbed import from_env

    try:
        bed = from_env()
        if isinstance(bed, LocalTestBed):
            bed.up()
    except PrerequisiteMissing as exc:
        pytest.fail(f"the smartclient test bed cannot start: {exc}", pytrace=False)
    return bed


@pytest.fixture
def faulty_testbed(testbed: TestBed) -> Iterator[TestBed]:
    yield testbed
    testbed.heal()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
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
def unique_name(request: pytest.FixtureRequest) -> str:
    base = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:40]
    return f"sc-{base}-{uuid.uuid4().hex[:6]}"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[Any]:
    try:
        return (yield)
    except FaultUnavailable as exc:
        pytest.skip(str(exc))
