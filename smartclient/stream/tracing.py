"""OpenTelemetry traces of one Environment's stream wing (``docs/observability.md#traces``).

Made only when a tracer provider was given or set (see :func:`smartclient._otel.tracer`); otherwise nothing here
runs.  With tracing on, every span is per placement, per Publish frame or per chunk, never per message:

- ``smartclient.place`` per placement, with each attempt as an event (dialled, reported node, outcome);
- ``send {stream}`` per Publish frame, from its write to its confirm (made when the confirm arrives);
- ``process {stream}`` per chunk, current while the chunk's messages are in the callback.

Frame and chunk spans are roots: they are made in the connection's reader and delivery tasks, whose own
current span would be whatever was current when they were created.

With trace-context propagation on (off by default: it adds about 90 bytes and an AMQP 1.0 envelope to each
message), each message also gets a ``create {stream}`` span whose W3C context it carries in its application
properties, and each delivered message a ``process {stream}`` span that links to it.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from smartclient import _otel
from smartclient.core.landing import Attempt
from smartclient.core.topology import Role

__all__ = ["StreamTracing"]

_SYSTEM = {"messaging.system": "rabbitmq"}
Frames = list[tuple[int, float, int]]  # (last publishing id, written at (monotonic), messages) per frame


def _on(stream: str, operation: str, kind: str | None = None) -> dict[str, str]:
    return {**_SYSTEM, "messaging.destination.name": stream, "messaging.operation.name": operation,
            "messaging.operation.type": kind or operation}


class StreamTracing:
    """The spans of one Environment's placements, producers and consumers."""

    def __init__(self, tracer: _otel.Tracer, propagate: bool = False) -> None:
        self.tracer = tracer
        self.propagate = propagate
        self._chunks: dict[str, _otel.RootSpans] = {}  # stream -> its chunks' spans

    # -- placement ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def placing(self, role: Role, stream: str) -> Iterator[dict[str, Any]]:
        """A ``smartclient.place`` span, current while the placement runs (its attempts become events); put
        the connection it ends with under ``"conn"``."""
        span = self.tracer.start("smartclient.place", _otel.SpanKind.INTERNAL,
                                 {**_SYSTEM, "messaging.destination.name": stream, "smartclient.role": role.value})
        placed: dict[str, Any] = {}
        with _otel.use(span):
            yield placed
            if (conn := placed.get("conn")) is not None:
                span.set_attributes({"server.node": str(conn.node), "smartclient.dialled": str(conn.dialled),
                                     "smartclient.connection": conn.name})

    def attempt(self, attempt: Attempt) -> None:
        """One attempt of the placement under way (an event of its span)."""
        span = _otel.current()
        if not span.is_recording() or getattr(span, "name", None) != "smartclient.place":
            return  # an attempt outside a placement (a statistics connection): no span of its own to add to
        accepted = attempt.outcome.startswith(("accepted", "reused"))
        span.add_event("attempt", {
            "smartclient.target": str(attempt.target), "smartclient.dialled": str(attempt.dialled or ""),
            "smartclient.reported": str(attempt.reported or ""), "smartclient.accepted": accepted,
            "smartclient.outcome": attempt.outcome})

    # -- producers ---------------------------------------------------------------------------------------
    def frames(self, stream: str) -> Callable[[float, Frames], None]:
        """What a producer tells of its confirmed frames: one ``send {stream}`` span each, write to confirm."""
        name, attributes, start = f"send {stream}", _on(stream, "send"), self.tracer.start

        def confirmed(now: float, frames: Frames) -> None:
            wall = time.time_ns()
            for last, written, count in frames:
                span = start(name, _otel.SpanKind.PRODUCER, {**attributes, "messaging.batch.message_count": count,
                                                              "messaging.message.id": str(last)},
                             start_time=wall - int((now - written) * 1e9), root=True)
                span.end(end_time=wall)
        return confirmed

    def stamp(self, handle: Any) -> None:
        """With propagation on: ``handle`` (a Producer) gives each message a ``create {stream}`` span and carries
        its W3C context in the message's application properties (a ``bytes`` body becomes an AMQP 1.0 message;
        a filter function still sees the body as given)."""
        from smartclient.stream import _rstream

        name, attributes, start = f"create {handle.stream}", _on(handle.stream, "create"), self.tracer.start

        def stamped(body: Any) -> Any:
            span = start(name, _otel.SpanKind.PRODUCER, attributes)
            context = _otel.inject(span)
            span.end()
            if _rstream.is_amqp_message(body):
                message = body._replace(application_properties={**(body.application_properties or {}), **context})
            else:
                message = _rstream.amqp_message(body if type(body) is bytes else bytes(body), context)
            message.smartclient_body = body
            return message

        send, send_many, submit = handle.send, handle.send_many, handle.submit
        handle.send = lambda body, **kw: send(stamped(body), **kw)
        handle.send_many = lambda bodies, **kw: send_many([stamped(b) for b in bodies], **kw)
        handle.submit = lambda body, **kw: submit(stamped(body), **kw)
        buffer = handle.buffer
        if buffer is not None and (chosen := buffer.filter_value) is not None:
            buffer.filter_value = lambda message: chosen(getattr(message, "smartclient_body", message))

    # -- consumers ---------------------------------------------------------------------------------------
    def chunk(self, stream: str, count: int, first: int) -> Any:
        """What a consumer carrier runs each chunk's callbacks in: a current ``process {stream}`` span (the hot
        path: its spans' shape is made once per stream)."""
        spans = self._chunks.get(stream)
        if spans is None:
            spans = self._chunks[stream] = self.tracer.roots(f"process {stream}", _otel.SpanKind.CONSUMER,
                                                            _on(stream, "process"))
        return spans.open({"messaging.batch.message_count": count, "messaging.rabbitmq.stream.offset": first})

    def each(self, stream: str, callback: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """With propagation on: ``callback`` runs in a ``process {stream}`` span per message, linked to the span
        that created the message (when it carries a W3C trace context)."""
        if not self.propagate:
            return callback
        name, attributes, start = f"process {stream}", _on(stream, "process"), self.tracer.start

        def opened(message: Any, context: Any) -> Any:
            origin = _producer_context(message)
            return _otel.use(start(name, _otel.SpanKind.CONSUMER,
                                   {**attributes, "messaging.rabbitmq.stream.offset": context.offset},
                                   links=() if origin is None else (origin,)))

        if inspect.iscoroutinefunction(callback):
            async def traced_async(message: Any, context: Any) -> None:
                with opened(message, context):
                    await callback(message, context)
            return traced_async

        def traced(message: Any, context: Any) -> Awaitable[None] | None:
            with opened(message, context):
                return callback(message, context)  # type: ignore[no-any-return]
        return traced


def _producer_context(message: Any) -> Any:
    """The span context a delivered message carries in its application properties, or None."""
    from smartclient.stream import _rstream

    if isinstance(message, (bytes, bytearray, memoryview)):
        if b"traceparent" not in message:
            return None
        try:
            message = _rstream.decode_amqp_message(bytes(message))
        except Exception:  # not AMQP 1.0 after all: no context
            return None
    properties = getattr(message, "application_properties", None) or {}
    return _otel.extract({k.decode() if isinstance(k, bytes) else str(k): v for k, v in properties.items()})
