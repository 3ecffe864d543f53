"""Request/reply over the local random exchange (``x-local-random``, RabbitMQ 4.0+), with pika.

The exchange delivers a message only to queues on the node where it was published, so an RPC server
must sit on *every* node that clients publish on.  :class:`RpcServer` puts one (or more) there, each on
its own node-placed connection with an exclusive queue bound to the exchange; :func:`coverage` says,
from the management API, which nodes have a server and which have none.  :class:`RpcClient` publishes
with ``mandatory`` and publisher confirms, so a node without a server is a typed
:class:`NoRpcServer` naming that node at once, not a timeout; replies come over direct reply-to.

With tracing (a ``tracer_provider`` given, or the global one set; ``smartclient[otel]``), each call is a
``send {exchange}`` client span whose W3C context travels in the request's headers, and each request a
``process {exchange}`` server span, its child, on the node that served it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from smartclient import _otel
from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    NoRpcServer,
    RpcTimeout,
)
from smartclient.amqp._pika import basic_properties, pika_errors
from smartclient.core.retry import Backoff

if TYPE_CHECKING:
    from smartclient.amqp.placement import AmqpPlacer, PlacedConnection
    from smartclient.management import ManagementClient

__all__ = ["Coverage", "RpcClient", "RpcServer", "coverage", "declare_local_random_exchange"]

log = logging.getLogger(__name__)

API_POLL = Backoff(initial=0.05, factor=1.5, max=0.5)  # waiting for the management API to show a binding
SERVE_AGAIN = Backoff(initial=0.2, factor=2.0, max=2.0, jitter=0.2)  # a lost server placing itself again
NODE_POLL = Backoff.steady(0.5)  # while the management API says a lost server's node is down: how often it asks again

REPLY_TO = "amq.rabbitmq.reply-to"
Handler = Callable[[bytes, Any], bytes]


def declare_local_random_exchange(channel: Any, exchange: str) -> None:
    """Declare ``exchange`` as ``x-local-random`` (durable; idempotent).

    :raises ConfigurationError: no name.  :raises ConnectionFailed: the broker refused it (closing the
        channel: an exchange of another type by that name, RabbitMQ before 4.0).
    """
    if not exchange:
        raise ConfigurationError("the RPC exchange needs a name (the default exchange cannot be x-local-random)")
    with pika_errors(f"declaring the x-local-random exchange {exchange!r}"):
        channel.exchange_declare(exchange, exchange_type="x-local-random", durable=True)


@dataclass(frozen=True)
class Coverage:
    """Which nodes have at least one RPC server queue bound to the exchange."""

    exchange: str
    servers: dict[str, int] = field(default_factory=dict)  # node -> queues bound there
    without: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.without

    def __str__(self) -> str:
        have = ", ".join(f"{node} ({count})" for node, count in sorted(self.servers.items())) or "none"
        missing = ", ".join(self.without) or "none"
        return f"RPC servers on {self.exchange!r}: {have}; nodes without a server: {missing}"


def coverage(management: ManagementClient, exchange: str, vhost: str = "/") -> Coverage:
    """Read the exchange's bindings and each bound queue's node from the management API."""
    v = quote(vhost, safe="")
    nodes = sorted(str(n["name"]) for n in management.nodes())
    bindings = management.get(f"/api/exchanges/{v}/{quote(exchange, safe='')}/bindings/source")
    servers: dict[str, int] = {}
    for binding in bindings:
        if binding.get("destination_type") != "queue":
            continue
        queue = management.queue(vhost, str(binding["destination"]))
        node = str(queue.get("node") or queue.get("leader") or "")
        if node:
            servers[node] = servers.get(node, 0) + 1
    return Coverage(exchange, servers, tuple(n for n in nodes if n not in servers))


class _NodeServer(threading.Thread):
    """One server on one node: its own connection, an exclusive queue, and a consume loop.  Once it has
    served, a lost connection (the node restarted, the connection was closed) is not the end: it places a
    new connection on the same node, with back-off, until the node is back or the server is stopped."""

    def __init__(self, placer: AmqpPlacer, placed: PlacedConnection, exchange: str, handler: Handler,
                 prefetch: int, tracer: _otel.Tracer | None = None) -> None:
        super().__init__(name=f"smartclient-rpc-{placed.node}", daemon=True)
        self.placer = placer
        self.node = placed.node
        self.placed = placed
        self.exchange = exchange
        self.handler = handler
        self.prefetch = prefetch
        self.tracer = tracer
        self.queue = ""
        self.handled = 0
        self.restarts = 0  # times it served again after losing its connection
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        placed: PlacedConnection | None = self.placed
        failures = 0
        while not self._stopping.is_set():
            try:
                if placed is None:
                    placed = self.placed = self.placer.connect(self.node)
                self._serve(placed)
                failures = 0
            except Exception as exc:
                started = self.ready.is_set()
                if not started or isinstance(exc, (AuthenticationFailed, CertificateRejected)):
                    self.error = exc  # the first start failed (RpcServer.start reports it), or retrying repeats it
                    if started:
                        log.error("the RPC server on %s stopped: %s", self.node, exc)
                    self.ready.set()
                    return
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("the RPC server on %s lost its connection (%s, %d tries): serving again once the node "
                                "is back", self.node, exc, failures)
                if not self._node_running():  # no connections through the LB while its node is away
                    polls = NODE_POLL.delays()
                    while not self._stopping.wait(next(polls)) and not self._node_running():
                        pass
                    failures = 1  # it is back: place again soon (the LB may need a few health checks)
                self._stopping.wait(SERVE_AGAIN.delay(failures))
            finally:
                if placed is not None:
                    placed.close()
                    placed = None

    def _node_running(self) -> bool:
        """What the management API says of this server's node (True when it cannot say: try placing)."""
        try:
            row = self.placer.management.get(f"/api/nodes/{quote(self.node, safe='')}?columns=running")
        except Exception as exc:  # the API is down too, or the node left the cluster: placing will say
            log.debug("asking the management API whether %s runs: %s", self.node, exc)
            return True
        return not isinstance(row, dict) or bool(row.get("running", True))

    def _serve(self, placed: PlacedConnection) -> None:
        channel = placed.channel()
        declare_local_random_exchange(channel, self.exchange)
        with pika_errors(f"the RPC server on {placed.node}"):
            self.queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            channel.queue_bind(self.queue, self.exchange, routing_key="")
            channel.basic_qos(prefetch_count=self.prefetch)
            channel.basic_consume(self.queue, self._on_request)
            if self.ready.is_set():
                self.restarts += 1
                log.warning("the RPC server on %s serves again", placed.node)
            self.ready.set()
            while not self._stopping.is_set():
                placed.connection.process_data_events(time_limit=0.2)

    def _on_request(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        span = None
        if self.tracer is not None:  # a server span, the child of the caller's (its context is in the headers)
            span = self.tracer.start(f"process {self.exchange}", _otel.SpanKind.SERVER,
                                     {**_otel.messaging_attributes(self.exchange, self.placed.node, "process"),
                                      "messaging.message.conversation_id": str(properties.correlation_id)},
                                     parent=_otel.extract(properties.headers or {}))
        try:
            with contextlib.nullcontext() if span is None else _otel.use(span, end=False):  # the handler's spans nest
                reply = self.handler(body, properties)
        except Exception as exc:  # the client gets the error as the reply, flagged in a header
            log.warning("RPC handler on %s failed: %s", self.placed.node, exc)
            reply, headers = str(exc).encode(), {"x-rpc-error": type(exc).__name__}  # (the span recorded it)
        else:
            headers = {}
        finally:
            if span is not None:
                span.end()
        if properties.reply_to:
            channel.basic_publish(
                "", properties.reply_to, reply,
                basic_properties(correlation_id=properties.correlation_id,
                                 headers={"x-rpc-node": self.placed.node, **headers}),
            )
        channel.basic_ack(method.delivery_tag)
        self.handled += 1

    def stop(self) -> None:
        self._stopping.set()


class RpcServer:
    """RPC servers on every node (or on ``nodes``), ``per_node`` each, serving ``handler``.

    :param handler: ``(body, properties) -> reply body``.
    :param require_full_coverage: :meth:`start` raises :class:`NoRpcServer` when a node of the cluster
        is left without a server (otherwise it logs a warning).
    :param tracer_provider: an OpenTelemetry ``TracerProvider`` for a span per request (default: the global one,
        if set).
    """

    def __init__(self, placer: AmqpPlacer, exchange: str, handler: Handler, *,
                 nodes: Sequence[str] | None = None, per_node: int = 1, prefetch: int = 10,
                 require_full_coverage: bool = False, tracer_provider: Any = None) -> None:
        if per_node < 1:
            raise ConfigurationError(f"per_node must be at least 1, not {per_node}")
        if not exchange:
            raise ConfigurationError("the RPC exchange needs a name")
        self.placer = placer
        self.exchange = exchange
        self.handler = handler
        self.nodes = list(nodes) if nodes is not None else None
        self.per_node = per_node
        self.prefetch = prefetch
        self.require_full_coverage = require_full_coverage
        self.tracer = _otel.tracer(tracer_provider)
        self.servers: list[_NodeServer] = []

    def start(self, timeout: float = 30.0) -> Coverage:
        """Place and start the servers; return the coverage report."""
        names = self.nodes if self.nodes is not None else [n.name for n in self.placer.nodes()]
        for node in names:
            for _ in range(self.per_node):
                server = _NodeServer(self.placer, self.placer.connect(node), self.exchange, self.handler,
                                     self.prefetch, self.tracer)
                server.start()
                self.servers.append(server)
        for server in self.servers:
            if not server.ready.wait(timeout) or server.error is not None:
                self.stop()
                raise ConnectionFailed(
                    f"the RPC server on {server.placed.node} did not start: {server.error}"
                ) from server.error
        report = self.coverage()
        if not report.complete:
            if self.require_full_coverage:
                self.stop()
                raise NoRpcServer(f"{report}: clients on those nodes would get no answer", report.without[0])
            log.warning("%s: clients publishing there get NoRpcServer", report)
        return report

    def coverage(self) -> Coverage:
        """What the management API says now (servers of other processes count too)."""
        deadline = time.monotonic() + 5
        polls = 0
        while True:  # a queue just bound may take a moment to show in the API
            report = coverage(self.placer.management, self.exchange, self.placer.vhost)
            mine = {s.placed.node for s in self.servers}
            if mine <= set(report.servers) or time.monotonic() > deadline:
                return report
            polls += 1
            time.sleep(API_POLL.delay(polls))

    @property
    def handled(self) -> int:
        return sum(s.handled for s in self.servers)

    @property
    def restarts(self) -> int:
        """Times a server served again on its node after losing its connection."""
        return sum(s.restarts for s in self.servers)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        for server in self.servers:
            server.join(5)
        self.servers.clear()

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Reply:
    body: bytes
    node: str  # the node of the server that answered
    properties: Any


class RpcClient:
    """Calls over ``exchange`` from one placed connection (its node decides which servers can answer).

    :raises NoRpcServer: from :meth:`call`, when no server queue on the connection's node is bound.
    :raises RpcTimeout: from :meth:`call`, when no reply came within the timeout.
    :param tracer_provider: an OpenTelemetry ``TracerProvider`` for a span per call (default: the global one, if set).
    """

    def __init__(self, placed: PlacedConnection, exchange: str, timeout: float = 5.0, *,
                 tracer_provider: Any = None) -> None:
        self.placed = placed
        self.exchange = exchange
        self.timeout = timeout
        self.tracer = _otel.tracer(tracer_provider)
        self.channel = placed.channel()
        self._replies: dict[str, Reply] = {}
        with pika_errors(f"the RPC client on {placed.node}"):
            self.channel.confirm_delivery()  # so that a message returned by the broker fails its publish
            self.channel.basic_consume(REPLY_TO, self._on_reply, auto_ack=True)

    def _on_reply(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        node = str((properties.headers or {}).get("x-rpc-node", ""))
        self._replies[str(properties.correlation_id)] = Reply(body, node, properties)

    def call(self, body: bytes, timeout: float | None = None) -> Reply:
        """Publish ``body`` as a request and wait for its reply.

        :raises NoRpcServer: no server queue is bound to the exchange on this connection's node.
        :raises RpcTimeout: no reply within ``timeout`` (the client's timeout if None).
        :raises ConnectionFailed: the server's handler failed (its error is the message), or the connection
            or channel was lost.
        """
        node = self.placed.node

        def no_server() -> NoRpcServer:
            return NoRpcServer(
                f"no RPC server is bound to {self.exchange!r} on node {node}: the local random "
                f"exchange only delivers on the node the request was published on", node,
            )

        correlation_id = uuid.uuid4().hex
        if self.tracer is None:
            return self._call(body, timeout, correlation_id, no_server, None)
        span = self.tracer.start(f"send {self.exchange}", _otel.SpanKind.CLIENT, _otel.messaging_attributes(
            self.exchange, node, "send", **{"messaging.message.conversation_id": correlation_id}))
        with _otel.use(span):
            reply = self._call(body, timeout, correlation_id, no_server, _otel.inject(span))
            span.set_attribute("smartclient.rpc.replied_by", reply.node)
            return reply

    def _call(self, body: bytes, timeout: float | None, correlation_id: str, no_server: Callable[[], NoRpcServer],
              headers: dict[str, str] | None) -> Reply:
        node = self.placed.node
        with pika_errors(f"an RPC request to {self.exchange!r} on {node}", returned=no_server):
            self.channel.basic_publish(
                self.exchange, "", body,
                basic_properties(reply_to=REPLY_TO, correlation_id=correlation_id, headers=headers), mandatory=True,
            )
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            while correlation_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RpcTimeout(f"no reply on {self.exchange!r} from node {node} within the timeout")
                self.placed.connection.process_data_events(time_limit=min(left, 0.5))
        reply = self._replies.pop(correlation_id)
        if reply.properties.headers and "x-rpc-error" in reply.properties.headers:
            raise ConnectionFailed(f"the RPC server on {reply.node} failed: {reply.body.decode(errors='replace')}")
        return reply
