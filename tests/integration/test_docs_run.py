"""Docs that run (issue 53): every ```python block of README.md and docs/*.md runs against the test bed, one test
per block, its id the page and the line of its fence (``docs/streams.md:52``).

The blocks are written for a user's cluster.  Each runs as written, with three kinds of help, all of them here:

* **Placeholders.**  The string and port constants that stand for a user's cluster are replaced by the bed's
  (:func:`placeholders`): ``"my-lb:5552"`` is the bed's round-robin load balancer, ``amqp=5672`` its AMQP
  listener, ``"rabbitmq-stream+tls://rabbit.example.com:5551"`` a node's TLS listener, ``"rabbit-2@host-2"`` the
  bed's ``rabbit-2@localhost``, ``"/etc/certs/tls.crt"`` a client certificate from the bed's CA, a fleet of
  ``10_000`` clients one of :data:`FLEET`.  The streams, queues, exchanges and MQTT client ids a block names
  (:data:`RESOURCE_NAMES`: ``"orders"``, ``"invoices"``, ``"gateway-7"``...) become names that hold a token
  unique to the test, so whatever the block creates is found and deleted afterwards by that token.  A stream the
  block uses without creating it exists when it runs (``"orders"`` holding :data:`FILL` messages, ``"invoices"``
  a super stream; in a block of the AMQP 1.0 wing, a quorum queue).
* **Names the block leaves free.**  A block that goes on from an earlier one of its page (``await
  producer.send(body)``) finds the names it does not bind in :class:`Prelude`: ``env`` (an Environment through
  the LB, with the management API and the LB's listener for each protocol), ``api``, ``handle``, ``body``,
  ``idp`` (the bed's identity provider, answering OAuth2 token responses), ``spark``, ``df``...  smartclient's and
  ``resolvers``' public names are imported too; any other module a block uses, it imports itself.
* **What a block leaves open** (Environments, AMQP connections, MQTT clients and fleets, meter providers, a
  memory trimmer, Prometheus HTTP servers, Spark queries) is closed after it; then what it created is deleted.

A block with top-level ``await`` or ``async with`` runs as a coroutine on the test's event loop; any other block
runs in a worker thread, so ``asyncio.run(main())`` and the sync facade work there as they do for a user.  A
statement whose comment starts with an exception's name and a colon (``# ConfigurationError: unknown stream
argument``) must raise it.  A block that defines ``test_*`` functions (a test module, as in docs/testbed.md) has
them run with the fixtures they name; one that asks for ``rabbitmq_faulty_testbed`` injects faults and carries the
``faults`` mark (``-m "not faults"`` leaves it out while the bed is shared).  Blocks that need Spark or the
federation's brokers carry the ``spark`` and ``federation`` marks, as the suite's other tests do.

Every block runs: none is skipped (a fence that is not meant to run is not a ```python one).  A block that fails on
a bug of the library (not of the doc) is in :data:`KNOWN_BUGS`: a strict xfail naming the bug.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import inspect
import io
import logging
import re
import tokenize
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pytest

import resolvers
import smartclient
from smartclient import FaultUnavailable, ManagementError
from smartclient.testing import TestBed

from ..conftest import wait_until

log = logging.getLogger(__name__)
T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*$")
RAISES = re.compile(r"#\s*(?P<name>[A-Z]\w+):")
#: the longest a block may take once what it needs is ready
BLOCK_TIMEOUT = 90.0
#: the size of the MQTT fleet a block asks 10,000 clients of (the bed shares two cores)
FLEET = 30

#: the names the docs give streams, queues, exchanges and MQTT client ids, each made unique to the test
RESOURCE_NAMES = ("orders", "payments", "invoices", "readings", "orders-enriched", "orders-copy", "events",
                  "gateway-7", "gateway-8", "meter")
#: those created first when a block uses them without creating them: streams, but super streams as these say
PRECREATED = ("orders", "payments", "invoices", "orders-enriched", "orders-copy")
SUPER_STREAMS = {"invoices": 3}
#: messages written to a stream created first (``read_arrow("orders", 1000, 2000)`` reads 1,000 of them)
FILL = {"orders": 2500}
#: the stream that the prelude's objects of these names use, created first too
PRELUDE_STREAM = {"producer": "orders", "table": "orders", "stream": "orders"}
#: a federation's sites: the bed's independent brokers, broker-1 to broker-3
SITES = ("paris", "tokyo", "lima")
#: blocks that fail on a bug of the library, not of the doc: (page, text in the block) -> the bug
KNOWN_BUGS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Block:
    """One ```python block: its page (relative to the checkout), the line of its fence, its text."""

    page: str
    line: int
    source: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def tree(self) -> ast.Module:
        """Its syntax tree (top-level ``await`` allowed), each line numbered as on the page."""
        tree = compile(self.source, self.id, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        assert isinstance(tree, ast.Module)
        return ast.increment_lineno(tree, self.line)


def doc_blocks() -> list[Block]:
    found = []
    for path in PAGES:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            opening = FENCE.match(lines[i])
            if opening:
                indent = len(opening["indent"])
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
                text = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
                found.append(Block(str(path.relative_to(ROOT)), i + 1, text))
                i = end
            i += 1
    return found


# -- reading a block ----------------------------------------------------------------------------------------------


def free_names(tree: ast.Module) -> set[str]:
    """The names the block reads where it does not bind them: the prelude's to give.  A function's, lambda's and
    comprehension's own names are their own, as Python's scopes have them."""
    free: set[str] = set()

    def scope(nodes: list[ast.AST], own: set[str], outer: set[str]) -> None:
        bound, read, nested = set(own), set(), []
        todo = list(nodes)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                if not isinstance(node, ast.Lambda):  # its name, decorators and annotations belong out here
                    bound.add(node.name)
                    todo.extend([*node.decorator_list, *(a.annotation for a in arguments(node.args) if a.annotation)])
                    todo.extend([node.returns] if node.returns else [])
                todo.extend([*node.args.defaults, *(d for d in node.args.kw_defaults if d)])
                nested.append(node)
            elif isinstance(node, ast.ClassDef):
                bound.add(node.name)
                todo.extend([*node.bases, *node.decorator_list])
                nested.append(node)
            elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
                nested.append(node)
            else:
                if isinstance(node, ast.Name):
                    (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
                elif isinstance(node, ast.alias):
                    bound.add((node.asname or node.name).split(".")[0])
                elif isinstance(node, ast.ExceptHandler) and node.name:
                    bound.add(node.name)
                todo.extend(ast.iter_child_nodes(node))
        visible = outer | bound
        free.update(read - visible)
        for node in nested:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                scope(list(node.body), {a.arg for a in arguments(node.args)}, visible)
            elif isinstance(node, ast.Lambda):
                scope([node.body], {a.arg for a in arguments(node.args)}, visible)
            elif isinstance(node, ast.ClassDef):
                scope(list(node.body), set(), visible)
            else:
                targets = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
                parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
                scope([*parts, *(p for g in node.generators for p in (g.iter, *g.ifs))], targets, visible)

    scope(list(tree.body), set(), set())
    return free - set(dir(builtins))


def arguments(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *([args.vararg] if args.vararg else []), *args.kwonlyargs,
            *([args.kwarg] if args.kwarg else [])]


def constants(tree: ast.Module) -> set[Any]:
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}


def created(tree: ast.Module) -> set[str]:
    """The names (as written) the block passes to ``create_stream`` or ``create_super_stream`` itself."""
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("create_stream", "create_super_stream")
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def expected_errors(block: Block, namespace: dict[str, Any]) -> dict[int, str]:
    """The lines (as on the page) whose comment starts with an exception's name and a colon: each must raise it."""
    expected = {}
    for token in tokenize.generate_tokens(io.StringIO(block.source).readline):
        found = RAISES.match(token.string) if token.type == tokenize.COMMENT else None
        if found:
            kind = namespace.get(found["name"], getattr(builtins, found["name"], None))
            if isinstance(kind, type) and issubclass(kind, BaseException):
                expected[block.line + token.start[0]] = found["name"]
    return expected


class Rewrite(ast.NodeTransformer):
    """Placeholders replaced by the bed's values (exact string and integer constants), and each statement that
    must raise wrapped in ``with __raises__(TheError):``."""

    def __init__(self, strings: dict[str, str], ints: dict[int, int], expected: dict[int, str]) -> None:
        self.strings, self.ints, self.expected = strings, ints, expected

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        value = node.value
        if isinstance(value, str) and value in self.strings:
            return ast.copy_location(ast.Constant(self.strings[value]), node)
        if type(value) is int and value in self.ints:
            return ast.copy_location(ast.Constant(self.ints[value]), node)
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                setattr(node, name, [self.expect(statement) for statement in statements])
        return node

    def expect(self, statement: ast.stmt) -> ast.stmt:
        error = self.expected.get(statement.end_lineno or statement.lineno)
        if error is None:
            return statement
        raises = ast.Call(ast.Name("__raises__", ast.Load()), [ast.Name(error, ast.Load())], [])
        return ast.copy_location(ast.With(items=[ast.withitem(raises)], body=[statement]), statement)


# -- the bed's side -----------------------------------------------------------------------------------------------


def available(what: Callable[[], T]) -> T | None:
    """``what()``, or None where the bed cannot give it (an external bed has no CA, IdP or SNI ingress)."""
    try:
        return what()
    except FaultUnavailable:
        return None


def placeholders(bed: TestBed, token: str, tmp: Path, sites: list[Any]) -> tuple[dict[str, str], dict[int, int]]:
    """What the docs' constants for a user's cluster stand for on the bed: strings, then ports and sizes."""
    lb_host, lb_port = bed.lb("stream")
    lb = f"{lb_host}:{lb_port}"
    through_lb = bed.stream_uri(lb_host, lb_port)  # (the docs' app:secret and guest:guest are the bed's user)
    node = bed.nodes[0]
    names = {name: f"docs-{token}-{name}" for name in RESOURCE_NAMES}
    strings = {
        **names,
        "orders,payments": f"{names['orders']},{names['payments']}",
        # the load balancer, and URIs through it
        "my-lb:5552": lb, "lb:5552": lb, "lb.example": lb_host,
        **dict.fromkeys(["rabbitmq-stream://app:secret@my-lb:5552/", "rabbitmq-stream://app:secret@lb.example:5552/",
                         "rabbitmq-stream://guest:guest@lb:5552", "rabbitmq-stream://guest:guest@lb:5552/"],
                        through_lb),
        # a node, dialled directly
        "rabbitmq-stream://guest:guest@localhost:5552/": bed.stream_uri(node.advertised_host, node.stream_port),
        "rabbit-2@host-2": bed.node("rabbit-2").name,
        # a locked cluster: TLS and the management API
        "rabbitmq-stream+tls://rabbit.example.com:5551":
            f"rabbitmq-stream+tls://{node.advertised_tls_host}:{node.stream_tls_port}",
        "https://rabbitmq.example.com": node.management_url,
        # Spark's checkpoint
        "/chk/orders-enricher-v1": str(tmp / "checkpoint"), "/chk/orders-copy": str(tmp / "checkpoint-copy"),
    }
    ints = {5552: lb_port, 5672: bed.lb("amqp")[1], 1883: bed.lb("mqtt")[1], 10_000: FLEET}
    certificate = available(bed.client_certificate)
    if certificate is not None:
        strings.update({"/etc/certs/tls.crt": str(certificate.cert_file),
                        "/etc/certs/tls.key": str(certificate.key_file)})
    sni = {protocol: available(lambda p=protocol: bed.sni(p)) for protocol in ("stream", "amqp", "mqtt")}
    if sni["stream"] and sni["amqp"] and sni["mqtt"]:
        strings.update({"ingress.example.com:5551": "{}:{}".format(*sni["stream"]),
                        "rabbitmq-stream+tls://rabbit-server-0.rabbitmq.example.com:5551":
                            f"rabbitmq-stream+tls://rabbit-1.smartclient.test:{sni['stream'][1]}"})
        ints.update({5671: sni["amqp"][1], 8883: sni["mqtt"][1]})
    if sites:
        strings.update({"admin": bed.username, "pw": bed.password})
    for site, broker in zip(SITES, sites, strict=False):
        amqp = f"amqp://{quote(bed.username, safe='')}:{quote(bed.password, safe='')}@{broker.host}:{broker.amqp_port}"
        strings.update({f"http://{site}:15672": broker.management_url, f"amqp://fed:secret@{site}:5672": amqp,
                        f"amqps://fed:secret@{site}:5671": amqp})
    return strings, ints


class BedIdp:
    """The bed's identity provider as an OAuth2 client: ``client_credentials()`` answers a token response."""

    def __init__(self, bed: TestBed) -> None:
        self.bed = bed

    def client_credentials(self) -> dict[str, Any]:
        token, _ = self.bed.tokens.mint("docs-run", 60)
        return {"access_token": token, "expires_in": 60}


class ListSink:
    """Where ``sink.write_batch(batch)`` writes: a list."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def write_batch(self, batch: Any) -> None:
        self.batches.append(batch)


def handle(*args: Any) -> None:
    """A message handler for any wing: streams' ``(message, context)``, paho's ``(client, userdata, message)``."""


#: what the application brings, as the blocks use it
VALUES: dict[str, Callable[[], Any]] = {
    "handle": lambda: handle, "on_message": lambda: handle, "callback": lambda: handle,
    "body": lambda: b'{"customer": 42, "region": "eu"}', "b1": lambda: b"first", "b2": lambda: b"second",
    "rows": lambda: [b"row %d" % n for n in range(10)],
    "customer_id": lambda: lambda body: str(len(body)), "region_of": lambda: lambda body: "eu",
    "is_eu": lambda: lambda message: True,
    "dead_letters": list, "log": lambda: logging.getLogger("docs-run"), "sink": ListSink,
}


@dataclass
class Prelude:
    """Builds, on demand, the objects a block leaves free; :attr:`stack` closes them after the block."""

    bed: TestBed
    names: dict[str, str]
    request: pytest.FixtureRequest
    stack: contextlib.AsyncExitStack
    made: dict[str, Any] = field(default_factory=dict)

    async def get(self, name: str) -> Any:
        if name not in self.made:
            make = VALUES.get(name) or getattr(self, f"make_{name}", None)
            if make is None:
                raise NameError(f"the block uses {name!r}, which neither it nor the prelude defines")
            value = make()
            self.made[name] = await value if inspect.isawaitable(value) else value
        return self.made[name]

    def lb_address(self) -> str:
        return "{}:{}".format(*self.bed.lb("stream"))

    # the user's cluster
    def make_uri(self) -> str:
        return self.bed.stream_uri(*self.bed.lb("stream"))

    def make_url(self) -> str:
        return self.bed.nodes[0].management_url

    def make_user(self) -> str:
        return self.bed.username

    def make_pw(self) -> str:
        return self.bed.password

    def make_api(self) -> Any:
        api = self.bed.management()
        self.stack.callback(api.close)
        return api

    def make_context(self) -> Any:
        return self.bed.tls_context()

    def make_idp(self) -> BedIdp:
        return BedIdp(self.bed)

    def make_creds(self) -> Any:
        return smartclient.TokenCredentials(self.bed.tokens.provider("docs-run", 60))

    def make_rabbitmq_testbed(self) -> TestBed:
        return self.bed

    # an Environment through the LB, and what the page made with it before the block
    async def make_env(self) -> Any:
        listeners = {protocol: port[1] for protocol in ("amqp", "mqtt", "mqtt_tls")
                     if (port := available(lambda p=protocol: self.bed.lb(p)))}
        env = smartclient.Environment(await self.get("uri"), management=await self.get("api"),
                                      resolver=resolvers.LoadBalancer(self.lb_address(), **listeners))
        return await self.stack.enter_async_context(env)

    async def make_lb_env(self) -> Any:
        return await self.get("env")

    def make_stream(self) -> str:
        return self.names["orders"]

    async def make_producer(self) -> Any:
        return await (await self.get("env")).producer(self.names["orders"])

    async def make_table(self) -> Any:
        return await (await self.get("env")).read_arrow(self.names["orders"])

    # Spark: the local session, a streaming DataFrame of orders, a connection through the LB
    def make_spark(self) -> Any:
        spark = self.request.getfixturevalue("rabbitmq_spark")
        self.stack.callback(stop_queries, spark)
        return spark

    async def make_df(self) -> Any:
        spark = await self.get("spark")
        return (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
                .selectExpr("value % 4 AS customer", "value AS order_id", "CAST(value AS STRING) AS body",
                            "'eu' AS region"))

    async def make_connection(self) -> Any:
        from smartclient.spark import StreamConnection

        return StreamConnection(await self.get("uri"), resolver=resolvers.LoadBalancer(self.lb_address()))


async def create_streams(bed: TestBed, tree: ast.Module, free: set[str], names: dict[str, str],
                         quorum: bool) -> None:
    """The streams (quorum queues, for the AMQP 1.0 wing) the block or its prelude uses and the block does not
    create."""
    named = constants(tree) | {PRELUDE_STREAM[name] for name in free & set(PRELUDE_STREAM)}
    if "orders,payments" in named:
        named |= {"orders", "payments"}
    wanted = [name for name in PRECREATED if name in named - created(tree)]
    if not wanted:
        return
    if quorum:
        with bed.management() as api:
            for name in wanted:
                api.put(f"/api/queues/%2F/{quote(names[name], safe='')}",
                        {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        return
    node = bed.nodes[0]
    async with smartclient.Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        for name in wanted:
            if name in SUPER_STREAMS:
                await env.create_super_stream(names[name], partitions=SUPER_STREAMS[name])
                continue
            await env.create_stream(names[name])
            if name in FILL:
                producer = await env.producer(names[name])
                await producer.send_batch([b'{"order": %d}' % n for n in range(FILL[name])])
                await producer.close()


async def close_left_open(namespace: dict[str, Any], given: dict[str, Any]) -> None:
    """Close what the block opened and left open (the application's to close, as the docs say)."""
    from smartclient.allocator import MemoryTrimmer
    from smartclient.amqp.placement import PlacedConnection
    from smartclient.mqtt._paho import PahoClient
    from smartclient.mqtt.fleet import MqttFleet
    from smartclient.sync import SyncEnvironment

    for name, value in list(namespace.items()):
        if name.startswith("__") or given.get(name) is value:
            continue
        try:
            if isinstance(value, smartclient.Environment):
                await value.close()
            elif isinstance(value, SyncEnvironment | PlacedConnection | MqttFleet):
                await asyncio.to_thread(value.close)
            elif isinstance(value, PahoClient):
                await asyncio.to_thread(value.close_quietly)
            elif isinstance(value, MemoryTrimmer):
                value.close()
            elif type(value).__module__.startswith("opentelemetry.sdk.metrics") and hasattr(value, "shutdown"):
                value.shutdown()
        except Exception as exc:  # the block's own failure, if any, is what the test reports
            log.warning("closing the block's %s: %r", name, exc)


def stop_queries(spark: Any) -> None:
    for query in spark.streams.active:
        query.stop()


def delete_named(bed: TestBed, token: str) -> None:
    """Delete every queue and exchange of the cluster whose name holds the test's token."""
    with bed.management() as api:
        for kind in ("queues", "exchanges"):
            for item in api.get(f"/api/{kind}/%2F?columns=name"):
                if token in item["name"]:
                    try:
                        api.delete(f"/api/{kind}/%2F/{quote(item['name'], safe='')}")
                    except ManagementError as exc:  # gone since it was listed (an MQTT QoS 0 subscription's queue
                        if exc.status != 404:  # goes with its client: CI-like run 28)
                            raise


@contextlib.contextmanager
def prometheus_servers() -> Iterator[None]:
    """``prometheus_client.start_http_server(port)`` binds a free port instead (9464 may be taken), and is shut
    down afterwards."""
    import prometheus_client

    started: list[Any] = []
    original = prometheus_client.start_http_server

    def start_http_server(port: int, *args: Any, **kwargs: Any) -> Any:
        server = original(0, *args, **kwargs)
        started.append(server)
        return server

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prometheus_client, "start_http_server", start_http_server)
        try:
            yield
        finally:
            for server, _thread in started:
                server.shutdown()
                server.server_close()


@contextlib.contextmanager
def federation_sites(bed: TestBed, wanted: bool) -> Iterator[list[Any]]:
    """The bed's independent brokers, one per site, for a block that federates; those started here are stopped
    (an external bed raises FaultUnavailable, which skips)."""
    if not wanted:
        yield []
        return
    from smartclient.testing.local import LocalTestBed

    local = bed if isinstance(bed, LocalTestBed) else None
    running = {f"broker-{i}" for i in range(1, len(SITES) + 1) if local and local.broker(f"broker-{i}").running()}
    nodes = bed.start_brokers(len(SITES))
    try:
        yield list(nodes)
    finally:
        for node in nodes:
            if local and node.short not in running:
                local.broker(node.short).stop()


async def run_tests(namespace: dict[str, Any], tree: ast.Module, request: pytest.FixtureRequest) -> None:
    """A block that is a test module: run its ``test_*`` functions with the fixtures they name."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
            function = namespace[node.name]
            outcome = function(**{name: request.getfixturevalue(name)
                                  for name in inspect.signature(function).parameters})
            if inspect.isawaitable(outcome):
                await asyncio.wait_for(outcome, BLOCK_TIMEOUT)


def run_block(code: Any, namespace: dict[str, Any]) -> None:
    """A block without ``await``, on a worker thread; where it has the Spark session, that session is the active one
    of the thread, as on the thread a user made it on (PySpark looks a Python data source up there)."""
    spark = namespace.get("spark")
    if spark is not None and hasattr(spark, "_jsparkSession"):
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
    exec(code, namespace)


async def first_batches(spark: Any) -> None:
    """Each streaming query the block started has finished a batch, and none failed."""
    for query in spark.streams.active:
        def progressed(query: Any = query) -> bool:
            if query.exception() is not None:
                raise AssertionError(f"the block's Spark query failed: {query.exception()}")
            return bool(query.recentProgress)

        await wait_until(progressed, 90, "the block's Spark query to finish a batch", interval=0.5)


def marks(block: Block) -> list[pytest.MarkDecorator]:
    found = [pytest.mark.xfail(reason=bug, strict=True)
             for (page, text), bug in KNOWN_BUGS.items() if block.page == page and text in block.source]
    if "rabbitmq_faulty_testbed" in block.source:
        found.append(pytest.mark.faults)
    if {"spark", "df"} & free_names(block.tree()):
        found.append(pytest.mark.spark)
    if "smartclient.federation" in block.source:
        found.append(pytest.mark.federation)
    return found


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=marks(b)) for b in doc_blocks()])
async def test_doc_block_runs(block: Block, rabbitmq_testbed: TestBed, request: pytest.FixtureRequest,
                              tmp_path: Path) -> None:
    bed = rabbitmq_testbed
    token = uuid.uuid4().hex[:8]
    written = block.tree()
    free = free_names(written)
    namespace: dict[str, Any] = {"__name__": "__docs__", "__raises__": pytest.raises,
                                 **{name: getattr(smartclient, name) for name in smartclient.__all__},
                                 **{name: getattr(resolvers, name) for name in resolvers.__all__}}
    with federation_sites(bed, "smartclient.federation" in block.source) as sites, prometheus_servers():
        strings, ints = placeholders(bed, token, tmp_path, sites)
        names = {name: strings[name] for name in RESOURCE_NAMES}
        tree = ast.fix_missing_locations(Rewrite(strings, ints, expected_errors(block, namespace)).visit(block.tree()))
        code = compile(tree, str(ROOT / block.page), "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        try:
            async with contextlib.AsyncExitStack() as stack:
                await create_streams(bed, written, free, names, quorum="amqp10" in block.source)
                prelude = Prelude(bed, names, request, stack)
                given = {name: await prelude.get(name) for name in sorted(free - set(namespace))}
                namespace.update(given)
                try:
                    if code.co_flags & inspect.CO_COROUTINE:
                        await asyncio.wait_for(eval(code, namespace), BLOCK_TIMEOUT)
                    else:
                        await asyncio.wait_for(asyncio.to_thread(run_block, code, namespace), BLOCK_TIMEOUT)
                    await run_tests(namespace, tree, request)
                    if "spark" in prelude.made:
                        await first_batches(prelude.made["spark"])
                finally:
                    await close_left_open(namespace, given)
        finally:
            await asyncio.to_thread(delete_named, bed, token)
