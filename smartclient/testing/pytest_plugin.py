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
* ``rabbitmq_namespaced_testbed`` (session): a namespaced bed, each node on its own address behind the load
  balancer (the session's own if namespaced, else one at port base 17000);
* ``rabbitmq_partitions``: that bed, for a test that partitions it (``bed.partition(...)``), healed after the test;
* ``rabbitmq_unique_name``: a stream/queue name unique to the test;
* ``rabbitmq_tokens``: the locked bed's identity provider (:class:`~smartclient.testing.oauth.TokenAuthority`),
  its faults undone after the test;
* ``rabbitmq_client_certificate``: a client certificate from the bed's CA for SASL EXTERNAL
  (:class:`~smartclient.testing.certificates.ClientCertificate`), its broker user created;
* ``rabbitmq_spark``: one local Spark session for the whole test session (needs ``smartclient[spark]`` and
  Java 17);
* ``rabbitmq_spark_cluster``: the test bed's Spark standalone cluster (a master and two workers, started once
  per test session) and a Spark session on it (:class:`SparkOnCluster`).

A driver JVM holds one SparkContext, so one session-scoped owner keeps "the current Spark session": asking
for the local one stops the one on the cluster, and the other way round.

A test that needs a feature of a newer RabbitMQ line says so with ``@pytest.mark.requires_rabbitmq("4.3")``:
on an older test bed it is skipped, and the reason names both versions.

A fault the test bed cannot inject (``FaultUnavailable``) skips the test and
says why; a missing prerequisite fails with one sentence, not a stack trace.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from smartclient._errors import FaultUnavailable, PrerequisiteMissing
from smartclient.testing import from_env
from smartclient.testing.certificates import ClientCertificate
from smartclient.testing.external import ExternalTestBed
from smartclient.testing.local import LocalTestBed
from smartclient.testing.oauth import TokenAuthority
from smartclient.testing.spark_cluster import SparkCluster
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


#: the namespaced bed the fixtures bring up beside the session's bed (which may be namespaced itself)
NAMESPACED_BASE = 17000


@pytest.fixture(scope="session")
def rabbitmq_namespaced_testbed(rabbitmq_testbed: TestBed) -> LocalTestBed:
    """A namespaced test bed (each node on its own address, reached only through the load balancer): the
    session's own if it is one (``SMARTCLIENT_TESTBED_NETWORK=namespaces``), else one at port base
    ``SMARTCLIENT_TESTBED_NAMESPACED_BASE`` (17000), brought up once.  Skips where namespaces cannot be made (not
    root, no ``ip`` or ``nft``: the reason is printed)."""
    if isinstance(rabbitmq_testbed, LocalTestBed) and rabbitmq_testbed.layout.namespaced:
        return rabbitmq_testbed
    if isinstance(rabbitmq_testbed, ExternalTestBed):
        pytest.skip("a namespaced bed is local: an external test bed is in use")
    base = os.environ.get("SMARTCLIENT_TESTBED_NAMESPACED_BASE", str(NAMESPACED_BASE))
    try:
        bed = LocalTestBed.from_env({**os.environ, "SMARTCLIENT_TESTBED_NETWORK": "namespaces",
                                     "SMARTCLIENT_TESTBED_PORT_BASE": base})
        bed.up()
    except PrerequisiteMissing as exc:
        pytest.skip(f"no namespaced test bed here: {exc}")
    return bed


@pytest.fixture
def rabbitmq_partitions(rabbitmq_namespaced_testbed: LocalTestBed) -> Iterator[LocalTestBed]:
    """The namespaced bed, for a test that cuts it (``bed.partition(...)``): ``heal()`` after the test."""
    yield rabbitmq_namespaced_testbed
    rabbitmq_namespaced_testbed.heal()


@pytest.fixture
def rabbitmq_tokens(rabbitmq_testbed: TestBed) -> Iterator[TokenAuthority]:
    """The locked bed's identity provider; its faults (revoke, expire_early) are undone after the test.  Skips on a
    bed without one (an external bed)."""
    try:
        tokens = rabbitmq_testbed.tokens
    except FaultUnavailable as exc:
        pytest.skip(str(exc))
    yield tokens
    tokens.restore()


@pytest.fixture
def rabbitmq_client_certificate(rabbitmq_testbed: TestBed) -> ClientCertificate:
    """The current client certificate ``smartclient-client`` from the bed's CA (its broker user exists), for SASL
    EXTERNAL.  Skips on a bed without a CA of its own (an external bed)."""
    try:
        return rabbitmq_testbed.client_certificate()
    except FaultUnavailable as exc:
        pytest.skip(str(exc))


@dataclass(frozen=True)
class SparkOnCluster:
    """What ``rabbitmq_spark_cluster`` gives: the running :class:`SparkCluster` and a ``SparkSession`` on its
    master with one executor per worker registered."""

    cluster: SparkCluster
    session: Any


class _SparkSessions:
    """The one Spark session of this driver: the local one or the one on the cluster, never both.

    The cluster is started on first use (idempotently: one a developer started is reused), healed on every later
    use (a worker a test killed runs again) and stopped at the end if this test session started it."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.session: Any = None
        self.cluster: SparkCluster | None = None
        self.stop_cluster = False
        self.server: Any = None  # the Connect server, while it runs (it holds the cluster's executors)

    def _current(self, kind: str) -> bool:
        if self.kind != kind:
            return False
        if kind == "connect":
            return not self.session.is_stopped
        return self.session.sparkContext._jsc is not None  # None once stopped

    def _stop_session(self) -> None:
        if self.session is not None:
            self.session.stop()
        if self.kind == "connect":  # pyspark marks the process as a Connect client for good: a classic session
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)  # asked for after it would be a Connect one
        self.kind = self.session = None
        if self.server is not None:  # the cluster's cores go back to the classic session
            self.server.stop()
            self.server = None

    def connect(self) -> Any:
        """A Spark Connect session on the Connect server of the cluster (started here, stopped when another kind
        of session is asked for)."""
        if not self._current("connect"):
            from smartclient.testing.spark_connect import ConnectServer

            self._stop_session()
            if self.cluster is None:
                self.cluster = SparkCluster.from_env()
                self.stop_cluster = not self.cluster.running()
            server = ConnectServer(self.cluster)
            server.start()
            self.server = server
            self.session = server.session()
            self.kind = "connect"
        return self.session

    def local(self) -> Any:
        if not self._current("local"):
            from smartclient.spark.session import local_session

            self._stop_session()
            self.session = local_session("local[2,4]", "smartclient-tests", log_level="WARN",
                                         spark_driver_memory="1g")
            self.kind = "local"
        return self.session

    def on_cluster(self) -> SparkOnCluster:
        if self.cluster is None:
            cluster = SparkCluster.from_env()
            self.stop_cluster = not cluster.running()
            self.cluster = cluster
        self.cluster.start()
        if self._current("cluster"):
            self.cluster.wait_executors(self.session)
        else:
            self._stop_session()
            self.session = self.cluster.session("smartclient-tests", spark_driver_memory="1g")
            self.kind = "cluster"
        return SparkOnCluster(self.cluster, self.session)

    def close(self) -> None:
        self._stop_session()
        if self.cluster is not None and self.stop_cluster:
            self.cluster.stop()


@contextlib.contextmanager
def _spark_prerequisites() -> Iterator[None]:
    try:
        from smartclient.testing.prerequisites import require_java

        require_java(17)
        import pyspark  # noqa: F401
        yield
    except PrerequisiteMissing as exc:
        pytest.fail(f"Spark cannot start: {exc}", pytrace=False)
    except ImportError:
        pytest.fail("Spark cannot start: pyspark is not installed (pip install 'smartclient[spark]')",
                    pytrace=False)


@pytest.fixture(scope="session")
def _rabbitmq_spark_sessions() -> Iterator[_SparkSessions]:
    sessions = _SparkSessions()
    yield sessions
    sessions.close()


@pytest.fixture
def rabbitmq_spark(_rabbitmq_spark_sessions: _SparkSessions) -> Any:
    """One local Spark session for the whole test session (``local[2,4]``: 2 cores, tasks retried up
    to 4 times), with the Python of this interpreter on the executors."""
    with _spark_prerequisites():
        return _rabbitmq_spark_sessions.local()


@pytest.fixture
def rabbitmq_spark_cluster(_rabbitmq_spark_sessions: _SparkSessions) -> SparkOnCluster:
    """The test bed's Spark standalone cluster (a master and two workers, each its own JVM, on 127.0.0.1; see
    :mod:`smartclient.testing.spark_cluster`), with every worker running, and a Spark session on its master with
    one executor per worker registered: ``.cluster`` and ``.session``.  Started once per test session, stopped at
    its end unless it already ran before."""
    with _spark_prerequisites():
        return _rabbitmq_spark_sessions.on_cluster()


@pytest.fixture
def rabbitmq_spark_connect(_rabbitmq_spark_sessions: _SparkSessions) -> Any:
    """A Spark Connect session (``SparkSession.builder.remote``) on a Connect server that runs as an application
    of the test bed's standalone cluster, with smartclient importable on its Python workers (see
    :mod:`smartclient.testing.spark_connect`).  The server is stopped when another Spark fixture is used."""
    with _spark_prerequisites():
        return _rabbitmq_spark_sessions.connect()


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
