"""The bad-input catalogue, generated from the signatures: every option of every public constructor and factory
method, given a value its annotation refuses (a str for a number, a dict for a settings object, ``object()`` for
a provider, NaN, infinity or a negative number), raises a typed error that names the option and the value, and
no connection is attempted first.  No broker: every socket is refused while a case runs, so a check that came
after I/O shows up as an attempted connection, never as a slow test.

What is covered is found, not listed: the names exported by every public module (test_public_api's list, less
the test bed's and the command line's), every public method of ``Environment`` and ``SyncEnvironment``, and
every settings class an annotation of theirs names.  A new public name, method or parameter is in the catalogue at once;
the catalogue fails if it does not know what a parameter takes (an annotation it cannot read, ``Any``, a
``**kwargs`` it cannot follow) until it is taught here, in the tables below.
"""

from __future__ import annotations

import ast
import asyncio
import datetime
import functools
import importlib
import inspect
import math
import os
import socket
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from resolvers import AllowList, Identity, SrvDiscovery
from smartclient import (
    Address,
    BatchingPolicy,
    ConfigurationError,
    ConsumerFlow,
    Environment,
    OffsetSpec,
    OffsetTracking,
    PlacementPolicy,
    PoolLimits,
    RecoveryPolicy,
    ResolutionError,
    RetryPolicy,
    Role,
    SmartClientError,
    StreamArguments,
    StreamFilter,
)
from smartclient.core.retry import Backoff
from smartclient.core.settings import ClientCertificate, ConnectionOptions, Credentials, Telemetry
from smartclient.credentials import ExternalLogin, TokenCredentials
from smartclient.federation.topology import FederatedBroker, FederationTopology, Link, UpstreamOptions, pair
from smartclient.management import ManagementClient
from smartclient.mqtt.fleet import MqttFleet
from smartclient.mqtt.placement import MqttOptions, MqttPlacer
from smartclient.options import ClientSettings, ConsumerOptions, ProducerOptions
from smartclient.spark import StreamConnection
from smartclient.sync import SyncEnvironment
from tests.unit.test_public_api import PUBLIC_MODULES

# The public modules whose names are in the catalogue, and why the others are not.
NOT_IN_THE_CATALOGUE = {
    "smartclient.testing": "the test bed: what it is given is the test bed's own layout, checked by test_layout",
    "smartclient.cli": "main(argv): argparse checks the command line",
}
MODULES = [importlib.import_module(name) for name in PUBLIC_MODULES if name not in NOT_IN_THE_CATALOGUE]

ENTRY = "rabbitmq-stream://guest:guest@127.0.0.1:1/"  # nothing listens there, and nothing may dial it anyway
MANAGEMENT = "http://127.0.0.1:1"


# -- the wrong values, and what each annotation takes ------------------------------------------------------
PROBES: tuple[tuple[str, Any], ...] = (
    ("a number in a str", "60"),
    ("a word", "half"),
    ("a bool", True),
    ("a fraction", 2.5),
    ("NaN", math.nan),
    ("infinity", math.inf),
    ("a negative number", -1),
    ("a dict", {"initial_credit": 5}),
    ("a list of numbers", [1, 2]),
    ("an object", object()),
)

# Classes an annotation may name, by the name it uses.  A class of smartclient's here must itself be in the
# catalogue (or in NOT_BUILT_BY_APPLICATIONS): a settings object a factory takes has its own options checked.
TYPES: dict[str, type] = {
    "Address": Address, "AllowList": AllowList, "BatchingPolicy": BatchingPolicy, "ConsumerFlow": ConsumerFlow,
    "ManagementClient": ManagementClient, "MqttOptions": MqttOptions, "MqttPlacer": MqttPlacer,
    "ClientSettings": ClientSettings, "Credentials": Credentials, "FederatedBroker": FederatedBroker,
    "ConnectionOptions": ConnectionOptions, "Telemetry": Telemetry, "TokenCredentials": TokenCredentials,
    "ExternalLogin": ExternalLogin, "ClientCertificate": ClientCertificate, "Backoff": Backoff,
    "os.PathLike": os.PathLike,
    "FederationTopology": FederationTopology, "Link": Link, "UpstreamOptions": UpstreamOptions,
    "OffsetSpec": OffsetSpec, "OffsetTracking": OffsetTracking, "PlacementPolicy": PlacementPolicy,
    "PoolLimits": PoolLimits, "RecoveryPolicy": RecoveryPolicy, "RetryPolicy": RetryPolicy, "Role": Role,
    "SrvDiscovery": SrvDiscovery, "StreamArguments": StreamArguments, "StreamConnection": StreamConnection,
    "StreamFilter": StreamFilter, "datetime.datetime": datetime.datetime, "ssl.SSLContext": ssl.SSLContext,
    "ProducerOptions": ProducerOptions, "ConsumerOptions": ConsumerOptions,
}
# Type aliases, as the union they stand for.
ALIASES = {
    "EntryPoints": "str | Address | Sequence[str | Address] | SrvDiscovery",
    "OnError": "Literal['stop', 'skip'] | Callable",
    "Edge": "tuple[str, str]",
}
CALLABLES = {"Callable", "ConfirmCallback", "MessageCallback"}


class UnknownAnnotation(Exception):
    pass


def _split(text: str, separator: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == separator and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


Union = list[tuple[str, list[Any]]]


def parse(annotation: str) -> Union:
    """``"int | Sequence[str] | None"`` as ``[("int", []), ("Sequence", [[("str", [])]]), ("None", [])]``."""
    terms: Union = []
    for term in _split(annotation, "|"):
        if term in ALIASES:
            terms.extend(parse(ALIASES[term]))
        elif term.endswith("]"):
            head, inner = term[:term.index("[")], term[term.index("[") + 1:-1]
            terms.append((head, [arg if head == "Literal" else parse(arg) for arg in _split(inner, ",")]))
        else:
            terms.append((term, []))
    return terms


def _takes_number(value: Any, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
        return False
    return math.isfinite(value) and value >= 0  # no option of smartclient takes a negative or infinite number


def accepts(union: Union, value: Any) -> bool:
    """Whether ``value`` is of a type the annotation names (a count or a time is never negative)."""
    return any(_accepts(head, args, value) for head, args in union)


def _accepts(head: str, args: list[Any], value: Any) -> bool:
    if head in ("Any", "object"):
        return True
    if head == "None":
        return value is None
    if head == "bool":
        return isinstance(value, bool)
    if head in ("int", "float"):
        return _takes_number(value, head == "int")
    if head == "str":
        return isinstance(value, str)
    if head in CALLABLES or head.startswith("Callable"):
        return callable(value)
    if head == "ResolverLike":
        return callable(value) or callable(getattr(value, "resolve", None))
    if head == "Literal":
        return any(value == ast.literal_eval(arg) and type(value) is str for arg in args)
    if head in ("Sequence", "list", "Iterable", "Collection", "tuple"):
        if not isinstance(value, list | tuple):
            return False
        if head == "tuple" and args and args[-1] != [("...", [])]:
            return len(value) == len(args) and all(accepts(a, v) for a, v in zip(args, value, strict=True))
        return all(accepts(args[0], item) for item in value)
    if head in ("Mapping", "dict", "MutableMapping"):
        return isinstance(value, Mapping) and all(accepts(args[0], k) and accepts(args[1], v) for k, v in value.items())
    if head in TYPES:
        return isinstance(value, TYPES[head])
    raise UnknownAnnotation(head)


# -- what the annotation cannot say --------------------------------------------------------------------
# Parameters typed Any: the wrong values each must still refuse (an empty list needs the reason it takes anything).
ANY: dict[str, tuple[str, list[Any]]] = {
    "Telemetry(meter_provider)": ("an OpenTelemetry MeterProvider: get_meter()", [object(), "otel"]),
    "Telemetry(tracer_provider)": ("an OpenTelemetry TracerProvider: get_tracer()", [object(), "otel"]),
    "ExactlyOnceSink(tracer_provider)": ("an OpenTelemetry TracerProvider: get_tracer()", [object()]),
    "StreamConnection(resolver)": ("a resolver: resolve() or a callable", [5, "lb:5552"]),
    **{f"{m}(entry_points)": ("listeners: 'host:port' strs or Addresses, or an SrvDiscovery", [5, object(), [1, 2]])
       for m in ("Environment.mqtt_placer", "Environment.mqtt_client", "Environment.mqtt_fleet", "NodePlacer",
                 "AmqpPlacer", "MqttPlacer")},
}
# Values of the right type that no option takes: what the annotation cannot tell.
MORE: dict[str, list[Any]] = {
    "Environment.super_stream_producer(routing)": ["round-robin"],
    "ExactlyOnceSink(partitioning)": ["random"],
    "MqttOptions(protocol)": ["half", 6],
    "OffsetSpec(kind)": ["half"],
    "StreamArguments(leader_locator)": ["nearest"],
    "UpstreamOptions(ack_mode)": ["always"],
    "FederationTopology(exchange_type)": ["x-consistent-hash"],
    "validate_topic(topic)": ["a/+/b"],
    "ConnectionOptions(name)": [""],
    "ConnectionOptions(frame_max)": [100],
    "ConnectionOptions(heartbeat)": [3601],
    "ConsumerFlow(credit_after)": [1.5],
}
# Where a typed error other than ConfigurationError is the documented one.
OTHER_ERRORS: dict[str, type[SmartClientError]] = {
    "as_async(resolver)": ResolutionError,  # a resolver that is none: documented as ResolutionError
    "as_resolver(resolver)": ResolutionError,
}
# The names an error may use instead of the parameter's own: *resolvers is checked one resolver at a time.
SAID_AS = {"Chain(resolvers)": "resolver"}

# Public names applications do not build: smartclient makes them and hands them over.
NOT_BUILT_BY_APPLICATIONS = {
    "Attempt": "one placement attempt, in a PlacementError",
    "Candidates": "the nodes a placement may use, from env.streams.candidates()",
    "Chunk": "what a consumer's on_chunk is handed",
    "Confirmation": "the fate of one message, from a producer",
    "Consumer": "made by Environment.consumer()",
    "MessageContext": "what a consumer's callback is handed",
    "PlacementRecord": "a row of Environment.placements()",
    "Producer": "made by Environment.producer()",
    "Role": "an enum of two members",
    "StreamTopology": "from Environment.topology()",
    "TopologyNode": "a row of the topology report",
    "Resolver": "the base class of the resolver contract: its methods are declared defaults, it takes nothing",
    "Resolves": "a Protocol: the contract's one required method",
    "ResolverLike": "a type alias",
    "SyncProducer": "made by SyncEnvironment.producer()",
    "SyncConsumer": "made by SyncEnvironment.consumer()",
    "SyncSuperStreamProducer": "made by SyncEnvironment.super_stream_producer()",
    "SyncSuperStreamConsumer": "made by SyncEnvironment.super_stream_consumer()",
    "SyncStreams": "SyncEnvironment.streams: the stream wing, its calls blocking",
    "RecoveryEvent": "what Environment.on_recovery's hooks are told: made by the wings, never by applications",
    "RabbitStreamDataSource": "built by Spark from string options, checked in tests/unit/spark/test_spark_source.py",
    "ClientSettings": "the one settings object the Environment hands every wing (Environment.settings)",
    "Landed": "where one placement landed, from NodePlacer.place()",
    "PlacedConnection": "made by AmqpPlacer.connect()",
    "PlacedMqttClient": "made by MqttPlacer.connect(): a paho Client",
    "FleetReport": "what MqttFleet.start() reports",
    "ApplyReport": "what federation's apply() and remove() report",
    "LinkStatus": "a row of federation's status()",
    "run_sync": "runs an awaitable to its end: it takes no option",
    "decode_amqp": "decodes a message body, which is data, not an option",
    "amqp_message": "builds a message from a body and its properties, which are data, not options",
    "compute_max_hops": "the arithmetic FederationTopology checks its links by",
    "copies": "the arithmetic FederationTopology checks its links by",
    "local_session": "a test and example helper that starts a local Spark",
    "register_format": "registers the format on the Spark session it is given (it checks that it is one)",
    "next_offsets": "a query of the broker, not an option",
    "offsets_behind": "reads a Spark progress report",
    "row_to_message": "the sink's per-row conversion",
}


# -- the targets -------------------------------------------------------------------------------------------
def _callback(message: Any, context: Any) -> None:
    pass


_BROKERS = [FederatedBroker(name, MANAGEMENT, "amqp://127.0.0.1:1") for name in ("a", "b", "c")]
# Valid values of the parameters each target needs; a case replaces one of them, or adds one.
BASE: dict[str, dict[str, Any]] = {
    "Token": {"value": "t", "expires_at": 2e9},
    "TokenCredentials": {"provider": lambda: ("t", 2e9)},
    "ClientCertificate": {"cert_file": "client.pem"},
    "Address": {"host": "h", "port": 1},
    "OffsetSpec": {"kind": "offset", "value": 0},
    "StreamFilter": {"values": ["eu"]},
    "hash_partition": {"key": "k", "partitions": ["p0", "p1"]},
    "parse_stream_uri": {"uri": "rabbitmq-stream://h"},
    "Environment": {"entry_points": ENTRY},
    "SyncEnvironment": {"entry_points": ENTRY},
    "AllowList": {"entries": ["10.0.0.0/8"]},
    "Chain": {},
    "DnsResolver": {"nameservers": ["127.0.0.1"]},
    "LoadBalancer": {"address": "lb:5552"},
    "SniRouter": {"address": "ingress:5551"},
    "SrvDiscovery": {"name": "_stream._tcp.example", "nameservers": ["127.0.0.1"]},
    "StaticMap": {"mapping": {"node-1": "127.0.0.1"}},
    "as_async": {"resolver": Identity()},
    "as_resolver": {"resolver": Identity()},
    "ExactlyOnceSink": {"connection": StreamConnection("rabbitmq-stream://h"), "app_id": "app", "stream": "s",
                        "key_columns": ["k"], "order_columns": ["o"]},
    "StreamConnection": {"uri": "rabbitmq-stream://h"},
    "ManagementClient": {"base_url": MANAGEMENT, "username": "u", "password": "p"},
    "NodePlacer": {"management": None},
    "AmqpPlacer": {"management": ManagementClient(MANAGEMENT, "u", "p")},
    "MqttPlacer": {"entry_points": ["127.0.0.1:1"]},
    "MqttFleet": {"placer": MqttPlacer(entry_points=["127.0.0.1:1"]), "size": 1},
    "mqtt_protocol": {"version": 5},
    "validate_topic": {"topic": "a/b"},
    "validate_filter": {"topic_filter": "a/#"},
    "topic_to_routing_key": {"topic": "a/b"},
    "filter_to_binding_key": {"topic_filter": "a/#"},
    **{f: {"api": ManagementClient(MANAGEMENT, "u", "p"), "stream": "s", "topic_filters": ["a/#"]}
       for f in ("bind_mqtt_topics", "unbind_mqtt_topics")},
    "mqtt_bindings": {"api": ManagementClient(MANAGEMENT, "u", "p"), "stream": "s"},
    "FederatedBroker": {"name": "a", "management_url": MANAGEMENT, "amqp_uri": "amqp://127.0.0.1:1"},
    "Link": {"upstream": "a", "downstream": "b", "max_hops": 1},
    "FederationTopology": {"brokers": tuple(_BROKERS[:2]), "links": (Link("a", "b", 1), Link("b", "a", 1)),
                           "exchange": "x"},
    "graph": {"brokers": _BROKERS, "edges": [("a", "b"), ("a", "c")], "exchange": "x"},
    "pair": {"a": _BROKERS[0], "b": _BROKERS[1], "exchange": "x"},
    "complete": {"brokers": _BROKERS, "exchange": "x"},
    "ring": {"brokers": _BROKERS, "exchange": "x"},
    "fan_out": {"brokers": _BROKERS, "tree": {"a": ["b", "c"]}, "exchange": "x"},
    **{f: {"topology": pair(*_BROKERS[:2], "x")} for f in ("apply", "remove", "status", "wait_running")},
    ".producer": {"stream": "s"},
    ".federated_broker": {"name": "site-a", "amqp_uri": "amqp://127.0.0.1:1"},
    ".on_recovery": {"hook": _callback},
    ".consumer": {"stream": "s", "callback": _callback},
    ".super_stream_producer": {"super_stream": "ss"},
    ".super_stream_consumer": {"super_stream": "ss", "callback": _callback},
    ".create_stream": {"stream": "s"},
    ".create_super_stream": {"super_stream": "ss", "partitions": 2},
    ".delete_stream": {"stream": "s"},
    ".delete_super_stream": {"super_stream": "ss"},
    ".topology": {"stream": "s"},
    ".candidates": {"stream": "s", "role": Role.PRODUCER},
    ".partitions": {"super_stream": "ss"},
    ".route": {"super_stream": "ss", "routing_key": "k"},
    ".stored_offset": {"stream": "s", "name": "n"},
    ".stream_stats": {"stream": "s"},
    ".read_arrow": {"stream": "s"},
    ".iter_arrow": {"stream": "s"},
    ".mqtt_client": {"client_id": "c"},
    ".mqtt_fleet": {"size": 1},
}
# Base values a case of the given parameter leaves out (they exclude each other).
LEAVES_OUT = {"on_chunk": ("callback",), "binding_keys": ("partitions",), "super_stream": ("stream",)}
# Where a **kwargs goes: the parameters it takes are those of this callable (less the ones named).
FORWARDS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "SyncEnvironment": (Environment.__init__, ("entry_points",)),
    "Environment.mqtt_fleet": (MqttFleet.__init__, ("placer", "size")),
    **{builder: (FederationTopology, ("brokers", "links", "exchange")) for builder in (
        "graph", "pair", "complete", "ring", "fan_out")},
    **{f"SyncEnvironment.{m}": (getattr(Environment, m), ()) for m in (
        "producer", "consumer", "super_stream_producer", "super_stream_consumer", "iter_arrow")},
}


@dataclass
class Target:
    name: str  # as cases are named: "Environment.consumer", "ConsumerFlow"
    function: Callable[..., Any]  # whose signature lists the options
    call: Callable[[tuple[Any, ...], dict[str, Any]], Any]
    base: dict[str, Any] = field(default_factory=dict)
    mirror: Callable[..., Any] | None = None  # the async Environment's, whose annotations a facade's Any stands for


def _awaited(result: Any) -> Any:
    return asyncio.run(result) if inspect.iscoroutine(result) else result


@functools.cache
def _management() -> ManagementClient:  # one for every case: making an httpx client takes milliseconds
    return ManagementClient(MANAGEMENT, "guest", "guest")


def _environment() -> Environment:
    return Environment(ENTRY, retry=RetryPolicy(max_attempts=1, max_time=1.0), management=_management())


def _on_environment(method: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    async def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        env = _environment()
        try:
            result = getattr(env, method)(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        finally:
            await env.close()

    return lambda args, kwargs: asyncio.run(call(args, kwargs))


def _on_sync_environment(method: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        start, Environment.start = Environment.start, _no_start  # type: ignore[method-assign]
        try:
            env = SyncEnvironment(ENTRY, retry=RetryPolicy(max_attempts=1, max_time=1.0), management=_management())
        finally:
            Environment.start = start  # type: ignore[method-assign]
        try:
            return getattr(env, method)(*args, **kwargs)
        finally:
            env.close()

    return call


async def _no_start(self: Environment) -> None:
    pass


def _plain(function: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    return lambda args, kwargs: _awaited(function(*args, **kwargs))


def _public_methods(cls: type) -> Iterator[str]:
    """Its own and inherited ones (the Environment face inherits the stream wing's)."""
    seen: set[str] = set()
    for klass in cls.__mro__[:-1]:
        for name, member in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(member) and name not in seen:
                seen.add(name)
                yield name


def _targets() -> list[Target]:
    targets: list[Target] = []
    exported = {}
    for module in MODULES:
        for name in module.__all__:
            value = getattr(module, name)
            if (isinstance(value, type) and issubclass(value, BaseException)) or not callable(value):
                continue
            exported[name] = value
    settings = {cls.__name__: cls for cls in TYPES.values() if cls.__module__.startswith(("smartclient", "resolvers"))}
    for name, value in {**settings, **exported}.items():
        if name in NOT_BUILT_BY_APPLICATIONS:
            continue
        targets.append(Target(name, value, _plain(value), BASE.get(name, {})))
    for method in _public_methods(Environment):
        targets.append(Target(f"Environment.{method}", getattr(Environment, method), _on_environment(method),
                              BASE.get(f".{method}", {})))
    for method in _public_methods(SyncEnvironment):
        targets.append(Target(f"SyncEnvironment.{method}", getattr(SyncEnvironment, method),
                              _on_sync_environment(method), BASE.get(f".{method}", {}),
                              getattr(Environment, method, None)))
    for target in targets:
        if target.name == "SyncEnvironment":
            target.mirror = Environment.__init__
    return targets


TARGETS = _targets()


# -- the cases ----------------------------------------------------------------------------------------------
@dataclass
class Case:
    target: Target
    parameter: str
    kind: inspect._ParameterKind
    annotation: str
    values: list[tuple[str, Any]]
    problem: str = ""  # why the catalogue cannot make this parameter's cases

    @property
    def id(self) -> str:
        return f"{self.target.name}({self.parameter})"

    def run(self, value: Any) -> Any:
        kwargs = {k: v for k, v in self.target.base.items() if k not in LEAVES_OUT.get(self.parameter, ())}
        if self.kind is inspect.Parameter.VAR_POSITIONAL:
            return self.target.call((value,), kwargs)
        return self.target.call((), {**kwargs, self.parameter: value})


def _annotation(parameter: inspect.Parameter) -> str:
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return "<none>"
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _parameters(target: Target) -> Iterator[tuple[inspect.Parameter, str]]:
    mirrored = dict(inspect.signature(target.mirror).parameters) if target.mirror else {}
    for parameter in inspect.signature(target.function).parameters.values():
        if parameter.name in ("self", "cls") or parameter.name.startswith("_"):
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            if target.name not in FORWARDS:
                yield parameter, "<**kwargs the catalogue cannot follow: add it to FORWARDS>"
                continue
            forwarded, skipped = FORWARDS[target.name]
            named = set(inspect.signature(target.function).parameters) | set(skipped)
            for inner in inspect.signature(forwarded).parameters.values():
                if inner.name not in named and inner.name != "self" and not inner.name.startswith("_") and \
                        inner.kind is not inspect.Parameter.VAR_KEYWORD:
                    yield inner, _annotation(inner)
            continue
        annotation = _annotation(parameter)
        if annotation == "Any" and parameter.name in mirrored:
            annotation = _annotation(mirrored[parameter.name])
        yield parameter, annotation


def _cases_of(target: Target) -> Iterator[Case]:
    """One case per parameter of ``target``, with the wrong values its annotation and the tables give."""
    for parameter, annotation in _parameters(target):
        case = Case(target, parameter.name, parameter.kind, annotation, [])
        key = case.id.replace("SyncEnvironment", "Environment")
        try:
            wrong = [(label, value) for label, value in PROBES if not accepts(parse(annotation), value)]
        except UnknownAnnotation as exc:
            case.problem = f"the catalogue does not know what {exc} takes in {annotation!r}: add it to TYPES"
            wrong = []
        if key in ANY:
            wrong += [(f"not {ANY[key][0]}", value) for value in ANY[key][1]]
        wrong += [("a value it does not take", value) for value in MORE.get(key, [])]
        if not wrong and not case.problem and not (key in ANY and ANY[key][1] == []):
            case.problem = f"{annotation!r} takes every value: add the parameter to ANY with the wrong values"
        case.values = wrong
        yield case


CASES = [case for target in TARGETS for case in _cases_of(target)]


# -- no I/O ------------------------------------------------------------------------------------------------
class IOAttempted(BaseException):  # not an Exception: nothing in smartclient may catch it and retry
    pass


@pytest.fixture
def io_attempts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every socket connect, send, name lookup or asyncio connection, refused (IOAttempted) and listed."""
    attempts: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            attempts.append(f"{what}{args[1:] if args and not isinstance(args[0], str) else args}")
            raise IOAttempted(what)

        return refused

    def refuse_async(what: str) -> Callable[..., Any]:
        async def refused(*args: Any, **kwargs: Any) -> Any:
            return refuse(what)(*args, **kwargs)

        return refused

    for owner, name in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket.socket, "sendto"),
                        (socket, "create_connection"), (socket, "getaddrinfo")):
        monkeypatch.setattr(owner, name, refuse(name))
    for name in ("create_connection", "getaddrinfo", "sock_connect", "create_datagram_endpoint"):
        monkeypatch.setattr(asyncio.base_events.BaseEventLoop, name, refuse_async(name))
    return attempts


def _names(message: str, case: Case, value: Any) -> bool:
    named = SAID_AS.get(case.id.split(".")[-1], case.parameter) in message
    shown = repr(value) in message or type(value).__name__ in message
    return named and shown


# -- the tests ---------------------------------------------------------------------------------------------
def test_every_public_name_is_in_the_catalogue_or_said_why_not() -> None:
    covered = {target.name for target in TARGETS}
    for module in MODULES:
        for name in module.__all__:
            value = getattr(module, name)
            if callable(value) and not (isinstance(value, type) and issubclass(value, BaseException)):
                assert name in covered or name in NOT_BUILT_BY_APPLICATIONS, f"{module.__name__}.{name}"
    assert {"Environment.consumer", "Environment.producer", "SyncEnvironment.consumer", "ConsumerFlow",
            "BatchingPolicy", "ExactlyOnceSink", "MqttOptions", "LoadBalancer"} <= covered
    assert set(NOT_BUILT_BY_APPLICATIONS) <= {name for module in MODULES for name in module.__all__} | set(TYPES)


def test_the_catalogue_knows_every_parameter() -> None:
    problems = [f"{case.id}: {case.problem}" for case in CASES if case.problem]
    assert not problems, "\n".join(problems)
    stale = set(ANY) | set(MORE) | set(OTHER_ERRORS) | set(SAID_AS)
    assert not stale - {case.id.replace("SyncEnvironment", "Environment") for case in CASES} - {
        case.id.split(".")[-1] for case in CASES}, "entries of no parameter"


def test_the_catalogue_is_large() -> None:
    parameters = [case for case in CASES if case.values]
    assert len(parameters) >= 350 and sum(len(case.values) for case in parameters) >= 3000
    print(f"{len(TARGETS)} targets, {len(parameters)} parameters, {sum(len(c.values) for c in parameters)} cases")


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_the_base_arguments_are_accepted(target: Target, io_attempts: list[str]) -> None:
    """What a case starts from is valid: the call succeeds, or gets as far as a connection."""
    try:
        target.call((), dict(target.base))
    except IOAttempted:
        pass
    except BaseException as exc:  # an error of a connection refused above is fine; one before it is not
        assert io_attempts, f"{target.name}({target.base}) was refused: {type(exc).__name__}: {exc}"


def _failures(case: Case, io_attempts: list[str]) -> list[str]:
    """What is wrong with how ``case``'s wrong values are refused: nothing, if each raised a typed error that
    names the parameter and the value, with no connection attempted."""
    expected = OTHER_ERRORS.get(case.id.split(".")[-1], ConfigurationError)
    failures = []
    for label, value in case.values:
        io_attempts.clear()
        try:
            case.run(value)
        except IOAttempted:
            failures.append(f"{label} {value!r}: a connection was attempted first: {io_attempts}")
        except SmartClientError as exc:
            if not isinstance(exc, expected):
                failures.append(f"{label} {value!r}: {type(exc).__name__}, not {expected.__name__}: {exc}")
            elif not _names(str(exc), case, value):
                failures.append(f"{label} {value!r}: the message does not name {case.parameter} and the value: {exc}")
            elif io_attempts:
                failures.append(f"{label} {value!r}: refused after a connection was attempted: {io_attempts}")
            elif "password" in case.parameter and repr(value) in str(exc):
                failures.append(f"{label}: the message shows the password: {exc}")
        except Exception as exc:
            failures.append(f"{label} {value!r}: untyped {type(exc).__name__}: {exc}")
        else:
            failures.append(f"{label} {value!r}: accepted")
    return failures


@pytest.mark.parametrize("case", [c for c in CASES if c.values], ids=[c.id for c in CASES if c.values])
def test_a_wrong_value_is_refused_by_name_before_any_io(case: Case, io_attempts: list[str]) -> None:
    failures = _failures(case, io_attempts)
    assert not failures, f"{case.id} ({case.annotation}):\n  " + "\n  ".join(failures)


@dataclass(frozen=True)
class _Policy:
    """A settings class as a new one might come: one option checked, one forgotten."""

    checked: int = 1
    forgotten: float = 1.0

    def __post_init__(self) -> None:
        from smartclient.core.validation import whole

        whole("_Policy.checked", self.checked, low=1)


class Widget:
    pass


def _factory(stream: str, *, anything: Any = None, widget: Widget | None = None) -> None:
    from smartclient.core.validation import text

    text("stream", stream)


def test_an_option_added_without_a_check_fails_the_catalogue(io_attempts: list[str]) -> None:
    cases = {case.parameter: case for case in _cases_of(Target("_Policy", _Policy, _plain(_Policy)))}
    assert not _failures(cases["checked"], io_attempts)
    assert any(failure.endswith("accepted") for failure in _failures(cases["forgotten"], io_attempts))
    cases = {case.parameter: case for case in _cases_of(Target("_factory", _factory, _plain(_factory),
                                                                {"stream": "s"}))}
    assert not _failures(cases["stream"], io_attempts)
    assert "takes every value: add the parameter to ANY" in cases["anything"].problem
    assert "does not know what Widget takes" in cases["widget"].problem


def test_the_untyped_errors_of_issue_29(io_attempts: list[str]) -> None:
    """The cases the issue found, each now a ConfigurationError (a ValueError too) that says what to pass."""
    with pytest.raises(ConfigurationError, match=r"meter_provider must be an OpenTelemetry MeterProvider "
                                                 r"\(with get_meter\(\)\) or None, not <object object"):
        Environment(ENTRY, telemetry=Telemetry(meter_provider=object()))
    with pytest.raises(ConfigurationError, match=r"tracer_provider must be an OpenTelemetry TracerProvider "
                                                 r"\(with get_tracer\(\)\) or None, not <object object"):
        Environment(ENTRY, telemetry=Telemetry(tracer_provider=object()))
    with pytest.raises(ConfigurationError, match=r"telemetry must be a Telemetry"):
        Environment(ENTRY, telemetry={"meter_provider": None})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ConsumerFlow.credit_after must be a number from 0 to 1 .*, "
                                         r"not 'half' \(a str\)"):
        ConsumerFlow(credit_after="half")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"BatchingPolicy.confirm_timeout must be a number from 0 to 86400 "
                                                 r".*, not '60' \(a str\)"):
        BatchingPolicy(confirm_timeout="60")  # type: ignore[arg-type]

    async def consume() -> None:  # (no start: the consumer would open the connections, were they allowed)
        await _environment().consumer("s", on_chunk=lambda chunk: None, flow={"initial_credit": 5})  # type: ignore[arg-type]

    with pytest.raises(ConfigurationError, match=r"flow must be a ConsumerFlow or None, not \{'initial_credit': 5\} "
                                                 r"\(a dict\): pass ConsumerFlow\(initial_credit=5\)"):
        asyncio.run(consume())
    assert not io_attempts
