"""Shared fixtures and helpers for tests against the real test bed (the test bed's own fixtures come from its plugin,
which tests/conftest.py enables, with the suite's waits)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import ssl
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from resolvers import SniRouter
from smartclient import Address, Environment, RetryPolicy
from smartclient.amqp.placement import AmqpPlacer
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, raw_stream_client

from ..conftest import bed_name, wait_until

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


class _NeverRetrieved(logging.Handler):
    """What asyncio logs of a future or task whose error nobody read ("... exception was never retrieved"): a
    failure that nobody was told of.  Each one is kept to fail the test it was logged in."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "exception was never retrieved" in message:
            self.seen.append(message.splitlines()[0] + " " + " ".join(message.splitlines()[1:2])[:300])


_NEVER_RETRIEVED = _NeverRetrieved()
logging.getLogger("asyncio").addHandler(_NEVER_RETRIEVED)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """After every fixture of the test has ended (its event loop closed too): collect the garbage, so that what it
    left unread is logged now, and fail the test if asyncio said of anything that its exception was never
    retrieved (issue 53)."""
    result = yield
    gc.collect()
    seen, _NEVER_RETRIEVED.seen[:] = list(_NEVER_RETRIEVED.seen), []
    if seen:
        pytest.fail(f"asyncio logged {len(seen)} exception(s) nobody retrieved: " + "; ".join(seen[:3]),
                     pytrace=False)
    return result


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as a module, to drive its functions from a test."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def open_stream_client(rabbitmq_testbed: TestBed) -> Callable[..., Any]:
    def opener(host: str, port: int, name: str = "") -> Any:
        return raw_stream_client(rabbitmq_testbed, host, port, name)

    return opener


# -- entering the bed ---------------------------------------------------------------------------------------------
def direct_uri(bed: TestBed) -> str:
    """The stream URI of the bed's first node, dialled directly (no load balancer)."""
    node = bed.nodes[0]
    return bed.stream_uri(node.host, node.stream_port)


def direct_env(bed: TestBed, **options: Any) -> Environment:
    """An Environment entering through the bed's first node directly; ``options`` are Environment's own."""
    return Environment(direct_uri(bed), **options)


def all_nodes(bed: TestBed) -> list[str]:
    """The stream URI of every node: an Environment given them all as entry points."""
    return [bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]


def node_index(bed: TestBed, address: Address | None) -> int:
    """Which of the bed's nodes advertises ``address``."""
    assert address is not None
    return [Address(*n.advertised) for n in bed.nodes].index(address)


@asynccontextmanager
async def stream_led_by(bed: TestBed, name: str, node: int) -> AsyncIterator[str]:
    """A stream ``name`` whose leader is node ``node``; after it, the bed healed and the stream deleted."""
    await create_stream_led_by(bed, name, node)
    try:
        yield name
    finally:
        bed.heal()
        await delete_streams(bed, name)


def router(bed: TestBed) -> SniRouter:
    """The bed's SNI ingress as a resolver: one TLS port per protocol, each routed by :func:`bed_name`."""
    host, port = bed.sni("stream")
    return SniRouter(Address(host, port), name=bed_name, amqp=bed.sni("amqp")[1], mqtt_tls=bed.sni("mqtt")[1])


def sni_environment(bed: TestBed, tls: ssl.SSLContext | None = None, retry: RetryPolicy | None = None) -> Environment:
    """Through the SNI ingress only: the entry point is a node's advertised name, routed by it."""
    entry = bed.stream_uri(bed_name(bed.nodes[0].name), bed.nodes[0].stream_tls_port)
    return Environment(entry.replace("rabbitmq-stream://", "rabbitmq-stream+tls://"), resolver=router(bed),
                       tls=tls or bed.tls_context(), management=bed.management(), retry=retry or RetryPolicy())


@pytest.fixture
async def env(rabbitmq_testbed: TestBed) -> AsyncIterator[Environment]:
    """An Environment on the bed's first node (:func:`direct_env`)."""
    async with direct_env(rabbitmq_testbed) as environment:
        yield environment


@pytest.fixture
async def stream(env: Environment, rabbitmq_unique_name: str) -> AsyncIterator[str]:
    """A new stream of the test's own, created and deleted through ``env``."""
    await env.create_stream(rabbitmq_unique_name)
    try:
        yield rabbitmq_unique_name
    finally:
        await env.delete_stream(rabbitmq_unique_name)


@pytest.fixture
def placer(rabbitmq_testbed: TestBed) -> Iterator[AmqpPlacer]:
    """An AMQP 0.9.1 placer that dials the nodes directly, as the management API lists them."""
    with rabbitmq_testbed.management() as api:
        yield AmqpPlacer(api)


def a_queue(bed: TestBed, kind: str) -> Iterator[str]:
    """A durable queue of ``kind`` (``quorum``, ``stream``) of its own, deleted after the test."""
    name = f"amqp10-{kind}-{uuid.uuid4().hex[:8]}"
    with bed.management() as api:
        api.put(f"/api/queues/%2F/{name}", {"durable": True, "arguments": {"x-queue-type": kind}})
        yield name
        api.delete(f"/api/queues/%2F/{name}")


@pytest.fixture
def queue(rabbitmq_testbed: TestBed) -> Iterator[str]:
    """A quorum queue of the test's own (:func:`a_queue`)."""
    yield from a_queue(rabbitmq_testbed, "quorum")


# -- writing and reading back -------------------------------------------------------------------------------------
def numbered(count: int, first: int = 0, *, suffix: bytes = b"", size: int = 0) -> list[bytes]:
    """``count`` bodies numbered from ``first`` (``b"7"``, then ``suffix``), each padded with ``x`` to ``size``."""
    return [(b"%d" % i + suffix).ljust(size, b"x") for i in range(first, first + count)]


async def publish(env: Environment, stream: str, bodies: list[bytes], *, one_by_one: bool = False) -> None:
    """``bodies`` sent to ``stream`` by a new producer, which is closed after: in frames of 250 (several chunks)
    and flushed, or ``one_by_one``, each waiting for its confirm."""
    producer = await env.producer(stream)
    if one_by_one:
        for body in bodies:
            await producer.send_wait(body)
    else:
        for start in range(0, len(bodies), 250):
            await producer.send_many(bodies[start:start + 250])
        await producer.flush()
    await producer.close()


async def read_to_end(env: Environment, stream: str, end: bytes | None = None, timeout: float = 30.0) -> list[bytes]:
    """Every body stored in ``stream`` before the end marker it appends (``end``, or a new one).  It reads up to
    that marker: a stream delivers in order, so every message stored before it, a duplicate too, has arrived when
    it has."""
    end = end or b"end-%s" % uuid.uuid4().hex.encode()
    await (await env.producer(stream)).send_wait(end)
    got: list[bytes] = []
    consumer = await env.consumer(stream, lambda m, c: got.append(bytes(m)), offset="first")
    # (``end in got``, not ``got[-1] == end``: a writer still at work may have stored more after it by the time
    # this looks)
    await wait_until(lambda: end in got, timeout, lambda: f"the end of {stream} ({len(got)} read)")
    await consumer.close()
    return got[:got.index(end)]  # (what came after it was stored after it)


async def read_stream(bed: TestBed, stream: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every JSON message in ``stream`` (:func:`read_to_end` through the first node) but the end markers, this one's
    (``{"end": ...}``) and any an earlier read left."""
    end = json.dumps({"end": uuid.uuid4().hex}).encode()
    async with direct_env(bed) as env:
        bodies = await read_to_end(env, stream, end, timeout)
    return [message for message in map(json.loads, bodies) if "end" not in message]


def forget_last_commit(checkpoint: Path) -> int:
    """A streaming query's checkpoint as if the query had stopped after writing its last batch and before committing
    it: that commit and its checksum taken out (with the checksum left, Spark takes the next commit for another
    query's), so a restart runs the batch again.  Returns the batch's id."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    return last


async def stored(bed: TestBed, stream: str) -> int:
    """How many messages ``stream`` holds, as the broker says (RabbitMQ 4.3's committed offset; 0 before): created
    if it does not exist yet."""
    async with direct_env(bed) as env:
        await env.create_stream(stream, exists_ok=True)
        return int((await env.stream_stats(stream)).get("committed_offset", -1)) + 1


def in_thread(spark: Any, work: Callable[[], Any]) -> asyncio.Future[None]:
    """``work()`` on a thread of its own whose active Spark session is ``spark`` (PySpark looks a Python data
    source up in the calling thread's active session), as a future of this loop."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if not done.done():
            done.set_result(None) if error is None else done.set_exception(error)

    def run() -> None:
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
        try:
            work()
        except BaseException as exc:  # handed to the test
            loop.call_soon_threadsafe(settle, exc)
        else:
            loop.call_soon_threadsafe(settle, None)

    threading.Thread(target=run, name="spark-write", daemon=True).start()
    return done
