"""The ONE place that imports OpenTelemetry: its API only (``pip install smartclient[otel]``), never the SDK.

Without the package, :func:`meter` and :func:`tracer` are None and smartclient records nothing.  With it but no
meter provider configured, the API's instruments are no-ops; with no tracer provider given or set, there is no
tracer, so no span is ever started.  Every instrument smartclient makes is created here, so the
names, units and descriptions of ``docs/observability.md`` live in one table (:data:`INSTRUMENTS`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["INSTRUMENTS", "Meter", "SpanKind", "Tracer", "configured", "current", "extract", "inject",
           "messaging_attributes", "meter", "observation", "observed", "recorded", "tracer", "use"]

Attributes = Mapping[str, str | int]
Reading = Callable[[], Iterable[tuple[float, Attributes]]]

#: name -> (kind, unit, description).  Kinds: ``counter`` and ``gauge`` are observed (read from counters the
#: client keeps anyway, when the reader collects: nothing on the publish path); ``sum`` is an observed
#: up-down counter; ``count`` and ``histogram`` are recorded when the event happens (placements, recoveries).
INSTRUMENTS: dict[str, tuple[str, str, str]] = {
    # the names the Java, Go and .NET stream clients share
    "rabbitmq.stream.connections": ("sum", "{connection}", "open stream connections"),
    "rabbitmq.stream.published": ("counter", "{message}", "messages handed to the broker"),
    "rabbitmq.stream.confirmed": ("counter", "{message}", "messages the broker confirmed"),
    "rabbitmq.stream.errored": ("counter", "{message}", "messages that failed (broker refusal or the client gave up)"),
    "rabbitmq.stream.outstanding_publish_confirm": ("sum", "{message}", "messages sent and not yet confirmed"),
    "rabbitmq.stream.consumed": ("counter", "{message}", "messages handed to consumer callbacks"),
    "rabbitmq.stream.chunk": ("counter", "{chunk}", "chunks received by consumers"),
    "rabbitmq.stream.chunk_size": ("histogram", "{message}", "messages per chunk received"),
    # the OpenTelemetry messaging semantic conventions
    "messaging.client.sent.messages": ("counter", "{message}", "messages sent"),
    "messaging.client.consumed.messages": ("counter", "{message}", "messages delivered to the application"),
    "messaging.client.operation.duration": ("histogram", "s", "publish to confirm, once per confirm frame"),
    # what only smartclient knows
    "smartclient.connections": ("sum", "{connection}", "producer and consumer placements, by node and role"),
    "smartclient.placement.sessions": ("counter", "{connection}", "connections opened to place (LB sessions)"),
    "smartclient.placement.mismatches": ("counter", "{connection}", "connections that reached another node"),
    "smartclient.placement.duration": ("histogram", "s", "time to place a producer or consumer"),
    "smartclient.placement.attempts": (
        "histogram", "{connection}", "connections one placement opened or tried: 0 when it shared or reused one"),
    "smartclient.placement.reused": ("counter", "{connection}", "placements that took a kept (parked) connection"),
    "smartclient.recoveries": ("counter", "{recovery}", "completed recoveries of producers and consumers"),
    "smartclient.recovery.duration": ("histogram", "s", "time from a loss to the handle working again"),
    "smartclient.recovery.resent": ("counter", "{message}", "unconfirmed messages sent again after a recovery"),
    "smartclient.resolution.duration": ("histogram", "s", "time the resolver took to answer for one connection"),
    "smartclient.dns.lookups": ("counter", "{lookup}", "DNS resolver answers: asked of a name server, or cached"),
    "smartclient.clients": ("sum", "{connection}", "connected AMQP and MQTT clients placed, by node"),
    "smartclient.consumer.lag": (
        "gauge", "{message}", "messages committed to the stream and not yet handed to the consumer (sampled)"),
}

#: histogram bucket boundaries smartclient advises (the SDK's default ones suit milliseconds, not these)
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0)
BUCKETS: dict[str, tuple[float, ...]] = {
    "rabbitmq.stream.chunk_size": (1, 2, 5, 10, 50, 100, 500, 1000, 5000, 10000),
    "smartclient.placement.attempts": (0, 1, 2, 3, 4, 6, 8, 12, 16, 32),
    **{name: _SECONDS for name, (_, unit, _) in INSTRUMENTS.items() if unit == "s"},
}

Meter = Any  # opentelemetry.metrics.Meter, or None


def meter(provider: Any = None, name: str = "smartclient") -> Meter:
    """``provider``'s meter for smartclient (the global meter provider's if None), or None when OpenTelemetry
    is not installed."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    return metrics.get_meter(name, meter_provider=provider)


def configured(provider: Any = None) -> bool:
    """Whether metrics go anywhere: a provider was given, or the global one is set (not the API's proxy or
    no-op default).  What costs something per Publish frame (confirm timing) is only done then; a provider
    set after the Environment was made still gets every observed instrument, through the API's proxy."""
    if provider is not None:
        return True
    from opentelemetry import metrics

    return type(metrics.get_meter_provider()).__name__ not in ("_ProxyMeterProvider", "NoOpMeterProvider")


def observation(value: float, attributes: Attributes) -> Any:
    from opentelemetry.metrics import Observation

    return Observation(value, dict(attributes))


def observed(m: Meter, name: str, reading: Reading) -> Any:
    """An observable instrument named ``name`` (from :data:`INSTRUMENTS`) whose values ``reading`` gives."""
    kind, unit, description = INSTRUMENTS[name]

    def callback(options: Any) -> Iterable[Any]:
        return [observation(value, attributes) for value, attributes in reading()]

    make = {"counter": m.create_observable_counter, "sum": m.create_observable_up_down_counter,
            "gauge": m.create_observable_gauge}[kind]
    return make(name, callbacks=[callback], unit=unit, description=description)


def recorded(m: Meter, name: str) -> Any:
    """A synchronous counter or histogram named ``name`` (from :data:`INSTRUMENTS`)."""
    kind, unit, description = INSTRUMENTS[name]
    if kind == "count":
        return m.create_counter(name, unit=unit, description=description)
    try:
        return m.create_histogram(name, unit=unit, description=description,
                                  explicit_bucket_boundaries_advisory=list(BUCKETS.get(name, _SECONDS)))
    except TypeError:  # an opentelemetry-api before 1.23 (installed by something else) takes no bucket advice
        return m.create_histogram(name, unit=unit, description=description)


# -- traces ------------------------------------------------------------------------------------------------
class SpanKind:
    """The span kinds smartclient starts (names of ``opentelemetry.trace.SpanKind``)."""

    INTERNAL = "INTERNAL"
    PRODUCER = "PRODUCER"
    CONSUMER = "CONSUMER"
    CLIENT = "CLIENT"
    SERVER = "SERVER"


class Tracer:
    """An OpenTelemetry tracer, with the few calls smartclient makes (start, link, make current)."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import trace

        self._tracer = tracer
        self._trace = trace

    def start(self, name: str, kind: str = SpanKind.INTERNAL, attributes: Attributes | None = None,
              start_time: int | None = None, links: Iterable[Any] = (), parent: Any = None,
              root: bool = False) -> Any:
        """A started span (``parent``: a span context; default: the current span; ``root``: none, a trace
        of its own, for spans made in the client's long-lived tasks, whose current span is stale)."""
        context = None
        if parent is not None:
            context = self._trace.set_span_in_context(self._trace.NonRecordingSpan(parent))
        elif root:
            from opentelemetry.context import Context

            context = Context()
        return self._tracer.start_span(name, context=context, kind=getattr(self._trace.SpanKind, kind),
                                       attributes=dict(attributes or {}), start_time=start_time,
                                       links=[self._trace.Link(c) for c in links] or None)


    def roots(self, name: str, kind: str, attributes: Attributes) -> RootSpans:
        """Spans of one name, kind and attributes, each the root of a trace of its own and current while it is
        open (a chunk's ``process`` span): :class:`RootSpans`."""
        return RootSpans(self._tracer, name, getattr(self._trace.SpanKind, kind), dict(attributes))


class RootSpans:
    """The hot path's spans (one per chunk a consumer is handed): started with the SDK's own call and made current
    by attaching their context directly, with what varies given per span; a third of :meth:`Tracer.start` and
    ``use_span``'s cost (``tests/unit/stream/test_telemetry_absent.py`` keeps the shape honest)."""

    __slots__ = ("_attach", "_context", "_detach", "_in_context", "_kind", "_name", "_root", "_start", "attributes")

    def __init__(self, tracer: Any, name: str, kind: Any, attributes: dict[str, Any]) -> None:
        from opentelemetry import context, trace

        self._start, self._name, self._kind, self.attributes = tracer.start_span, name, kind, attributes
        self._root, self._in_context = context.Context(), trace.set_span_in_context
        self._attach, self._detach = context.attach, context.detach

    def open(self, varying: dict[str, Any]) -> _Current:
        """A span with the attributes and ``varying`` (``with``: current inside; ended on exit, an error recorded)."""
        return _Current(self, self._start(self._name, context=self._root, kind=self._kind,
                                          attributes={**self.attributes, **varying}))


class _Current:
    """``with``: ``span`` current inside (its context attached, then detached), ended on exit."""

    __slots__ = ("_spans", "_token", "span")

    def __init__(self, spans: RootSpans, span: Any) -> None:
        self._spans, self.span = spans, span
        self._token: Any = None

    def __enter__(self) -> Any:
        self._token = self._spans._attach(self._spans._in_context(self.span))
        return self.span

    def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
        self._spans._detach(self._token)
        if error is not None and self.span.is_recording():
            self.span.record_exception(error)
        self.span.end()


def tracer(provider: Any = None, name: str = "smartclient") -> Tracer | None:
    """``provider``'s tracer for smartclient, or the global one's if it was set; None when OpenTelemetry is not
    installed or no tracer provider is given or set (then no span is started: nothing costs anything)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    if provider is None and type(trace.get_tracer_provider()).__name__ in ("ProxyTracerProvider",
                                                                           "NoOpTracerProvider"):
        return None
    return Tracer(trace.get_tracer(name, tracer_provider=provider))


@contextlib.contextmanager
def detached() -> Iterator[None]:
    """No current span inside: tasks created here (a connection's reader, its dial) do not keep the span of
    whatever called them as their current span for their whole life.  Other context variables (deadlines)
    still travel.  Nothing to do without OpenTelemetry."""
    try:
        from opentelemetry import context
    except ImportError:
        yield
        return
    token = context.attach(context.Context())
    try:
        yield
    finally:
        context.detach(token)


def current() -> Any:
    """The current span (a no-op one when there is none)."""
    from opentelemetry import trace

    return trace.get_current_span()


def use(span: Any, end: bool = True) -> Any:
    """A context manager making ``span`` the current one (ended on exit when ``end``; errors recorded)."""
    from opentelemetry import trace

    return trace.use_span(span, end_on_exit=end, record_exception=True, set_status_on_exception=True)


def inject(span: Any) -> dict[str, str]:
    """The W3C trace context of ``span``: ``traceparent`` (and ``tracestate`` if any)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def extract(carrier: Mapping[str, Any]) -> Any:
    """The span context a W3C ``traceparent`` (and ``tracestate``) names, or None."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    text = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in carrier.items()
            if k in ("traceparent", "tracestate")}
    if "traceparent" not in text:
        return None
    span = trace.get_current_span(TraceContextTextMapPropagator().extract(text))
    context = span.get_span_context()
    return context if context.is_valid else None


def messaging_attributes(destination: str, node: str, operation: str, **more: str) -> dict[str, str]:
    """The attributes of a messaging span of the AMQP wings (semantic conventions), and ``more``."""
    return {"messaging.system": "rabbitmq", "messaging.destination.name": destination, "server.node": node,
            "messaging.operation.name": operation, "messaging.operation.type": operation, **more}
