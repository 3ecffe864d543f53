"""Federation topologies between independent brokers, and the max_hops that make them exactly-once.  No I/O.

A link ``U -> D`` means: broker D's federated exchange has the exchange on broker U as an upstream, so
messages published at U are copied to D.  RabbitMQ forwards a message over a link when two things hold
(``rabbit_federation_util:should_forward/4``, 3.8.9 and later):

* fewer hops than the link's ``max-hops`` are recorded in its ``x-received-from`` header; and
* the downstream's cluster name (and vhost) is not among them: cycle detection.

So a message published at X reaches broker B once for every *simple* path ``X -> ... -> B`` whose *k*-th
link allows at least *k* hops.  :func:`compute_max_hops` finds, per link, a max_hops under which every
broker reachable from X gets exactly one copy, for every X, and :class:`FederationTopology` refuses a
graph where no such assignment exists (a ring linked both ways, say: the far side gets two copies or
none).  Cycle detection relies on distinct cluster names; :mod:`smartclient.federation.apply` checks them.

Builders for the seed's topologies: :func:`pair` and :func:`complete` (max_hops 1), :func:`ring` (each
broker federates from the one before it: max_hops n-1), :func:`fan_out` (a tree rooted at the source,
max_hops = its depth; ``both_ways`` makes every broker reach every other), and :func:`graph`.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from smartclient._errors import ConfigurationError
from smartclient.core.validation import choice, flag, instance, number, refuse, text, whole

__all__ = [
    "FederatedBroker",
    "FederationTopology",
    "Link",
    "UpstreamOptions",
    "complete",
    "compute_max_hops",
    "copies",
    "fan_out",
    "graph",
    "pair",
    "ring",
]

EXCHANGE_TYPES = ("topic", "direct", "fanout", "headers")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_SEARCH_LIMIT = 200_000


@dataclass(frozen=True)
class FederatedBroker:
    """One independent broker (or cluster).

    :param name: how the topology names it (letters, digits, ``_.:-``).
    :param management_url: its management API, e.g. ``http://host:15672``.
    :param amqp_uri: how *other brokers* reach its AMQP listener for their links
        (``amqp://user:pass@host:5672`` or ``amqps://...``).
    :param username: for its management API.
    :param password: for its management API.
    :param vhost: the vhost of the federated exchange.
    """

    name: str
    management_url: str
    amqp_uri: str = field(repr=False)  # carries credentials
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    vhost: str = "/"

    def __post_init__(self) -> None:
        for option in ("name", "management_url", "amqp_uri", "username", "vhost"):
            text(f"FederatedBroker.{option}", getattr(self, option))
        text("FederatedBroker.password", self.password, empty=True, secret=True)
        if not _NAME.match(self.name):
            raise ConfigurationError(f"broker name {self.name!r}: use 1-100 letters, digits or _.:-")
        if not self.management_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"broker {self.name}: management_url must start with http:// or https://")
        _check_amqp_uri(self.amqp_uri, f"broker {self.name}")


def _check_amqp_uri(uri: str, where: str) -> None:
    parts = urlsplit(uri)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise ConfigurationError(f"{where}: {_redact(uri)!r} is not an amqp:// or amqps:// URI with a host")


def _redact(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.password:
        return uri.replace(f":{parts.password}@", ":***@")
    return uri


@dataclass(frozen=True)
class UpstreamOptions:
    """The seed's upstream options, validated.  None leaves the broker's default.

    :param prefetch_count: unacknowledged messages in flight per link (broker default 1000).
    :param reconnect_delay: seconds before a link reconnects (default 1).
    :param heartbeat: AMQP heartbeat of the link's connection, in seconds (goes into the URI).
    :param expires: ms after which an unused upstream queue is deleted (``x-expires``).
    :param message_ttl: ms a message may wait in the upstream queue (``x-message-ttl``).
    :param ack_mode: ``on-confirm`` (default: no loss), ``on-publish`` or ``no-ack``.
    :param tls_uri_params: query parameters for ``amqps://`` upstream URIs (``cacertfile``,
        ``verify``, ``server_name_indication``...), as RabbitMQ's URI spec has them.
    """

    prefetch_count: int | None = None
    reconnect_delay: float | None = None
    heartbeat: int | None = None
    expires: int | None = None
    message_ttl: int | None = None
    ack_mode: str = "on-confirm"
    tls_uri_params: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        whole("UpstreamOptions.prefetch_count", self.prefetch_count, low=1, optional=True)
        number("UpstreamOptions.reconnect_delay", self.reconnect_delay, low=0.001, optional=True, note="seconds")
        whole("UpstreamOptions.heartbeat", self.heartbeat, low=0, optional=True, note="seconds")
        whole("UpstreamOptions.expires", self.expires, low=1, optional=True, note="ms")
        whole("UpstreamOptions.message_ttl", self.message_ttl, low=0, optional=True, note="ms")
        choice("UpstreamOptions.ack_mode", self.ack_mode, ("on-confirm", "on-publish", "no-ack"))
        _pairs_of_strs("UpstreamOptions.tls_uri_params", self.tls_uri_params)

    def uri(self, base: str) -> str:
        """``base`` with the heartbeat and, for ``amqps``, the TLS parameters in its query string."""
        query = dict(self.tls_uri_params) if base.startswith("amqps://") else {}
        if self.heartbeat is not None:
            query["heartbeat"] = str(self.heartbeat)
        if not query:
            return base
        sep = "&" if "?" in base else "?"
        return base + sep + "&".join(f"{k}={v}" for k, v in sorted(query.items()))

    def value(self) -> dict[str, object]:
        """The options as a federation-upstream parameter's keys (without uri and max-hops)."""
        out: dict[str, object] = {"ack-mode": self.ack_mode}
        if self.prefetch_count is not None:
            out["prefetch-count"] = self.prefetch_count
        if self.reconnect_delay is not None:
            out["reconnect-delay"] = self.reconnect_delay
        if self.expires is not None:
            out["expires"] = self.expires
        if self.message_ttl is not None:
            out["message-ttl"] = self.message_ttl
        return out


@dataclass(frozen=True)
class Link:
    """Messages flow from ``upstream`` to ``downstream`` (the downstream declares the upstream)."""

    upstream: str
    downstream: str
    max_hops: int

    def __post_init__(self) -> None:
        text("Link.upstream", self.upstream)
        text("Link.downstream", self.downstream)
        whole("Link.max_hops", self.max_hops, low=1)


Edge = tuple[str, str]


def _pairs_of_strs(name: str, value: object) -> None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        refuse(name, "a mapping of strs to strs", value)


def _all_of(name: str, value: object, kind: type) -> None:
    """``value`` is a list (or tuple) of ``kind``."""
    if not isinstance(value, list | tuple) or not all(isinstance(item, kind) for item in value):
        refuse(name, f"a list of {kind.__name__}", value)


def _edges(name: str, value: object) -> list[Edge]:
    """``value`` as a list of ``(upstream, downstream)`` names, if it is one (any iterable of such pairs)."""
    given = list(value) if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping) else None
    if given is None or not all(isinstance(e, tuple | list) and len(e) == 2 and all(isinstance(end, str) for end in e)
                                for e in given):
        refuse(name, "a list of (upstream, downstream) broker names", value)
    return [(str(u), str(d)) for u, d in given]


def _simple_paths(edges: Iterable[Edge], nodes: Sequence[str], limit: int) -> dict[Edge, list[tuple[Edge, ...]]]:
    """Every simple directed path (as a tuple of edges) from each node to each other node it reaches."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for u, d in edges:
        out[u].append(d)
    paths: dict[Edge, list[tuple[Edge, ...]]] = {}
    count = 0
    for origin in nodes:
        stack: list[tuple[str, tuple[Edge, ...], frozenset[str]]] = [(origin, (), frozenset([origin]))]
        while stack:
            at, path, seen = stack.pop()
            for nxt in out[at]:
                if nxt in seen:
                    continue
                longer = (*path, (at, nxt))
                paths.setdefault((origin, nxt), []).append(longer)
                count += 1
                if count > limit:
                    raise ConfigurationError(f"the federation graph has over {limit} simple paths: too large to check")
                stack.append((nxt, longer, seen | {nxt}))
    return paths


def copies(edges: Iterable[Edge], nodes: Sequence[str], max_hops: Mapping[Edge, int]) -> dict[Edge, int]:
    """How many copies of a message published at X reach B, for each ordered pair (X, B), X != B, under
    RabbitMQ's forwarding rule with the given per-link max_hops (0 copies are included)."""
    edges = list(edges)
    paths = _simple_paths(edges, nodes, _SEARCH_LIMIT)
    result = {(x, b): 0 for x in nodes for b in nodes if x != b}
    for pair_, ps in paths.items():
        result[pair_] = sum(1 for p in ps if all(max_hops[e] >= k for k, e in enumerate(p, start=1)))
    return result


def compute_max_hops(edges: Iterable[Edge], nodes: Sequence[str]) -> dict[Edge, int]:
    """A max_hops per link under which every broker reachable from any X gets exactly one copy of what is
    published at X.  The uniform answer (the longest shortest path) is tried first, then a search.

    :raises ConfigurationError: no assignment gives exactly once; the message names a pair that fails.
    """
    edges = sorted(set(edges))
    nodes = list(nodes)
    if not edges:
        raise ConfigurationError("a federation topology needs at least one link")
    paths = _simple_paths(edges, nodes, _SEARCH_LIMIT)
    distance = {pair_: min(len(p) for p in ps) for pair_, ps in paths.items()}
    uniform = max(distance.values())

    candidate = {e: uniform for e in edges}
    if all(sum(all(candidate[e] >= k for k, e in enumerate(p, 1)) for p in ps) == 1 for ps in paths.values()):
        return candidate
    # per-link search: each link needs at most the longest position it holds on any path
    positions = {e: sorted({k for ps in paths.values() for p in ps for k, x in enumerate(p, 1) if x == e})
                 for e in edges}
    found = _search(edges, positions, paths)
    if found is None:
        worst = max(paths.items(), key=lambda kv: len(kv[1]))
        (x, b), ps = worst
        raise ConfigurationError(
            f"no max_hops gives exactly-once delivery on this graph: {x} reaches {b} over {len(ps)} different "
            f"paths ({'; '.join(' -> '.join([p[0][0], *(e[1] for e in p)]) for p in ps[:3])}), and no hop limit "
            f"keeps exactly one of them for every pair; link it as a complete graph, a directed ring or a tree"
        )
    return found


def _search(edges: list[Edge], positions: Mapping[Edge, list[int]],
            paths: Mapping[Edge, list[tuple[Edge, ...]]]) -> dict[Edge, int] | None:
    """Backtracking over each link's meaningful values: the positions it holds on some path, and 1 (which,
    for a link never first on a path, shuts it for every path)."""
    order = sorted(edges, key=lambda e: -len(positions[e]))
    budget = itertools.count()
    assigned: dict[Edge, int] = {}

    def on(p: tuple[Edge, ...]) -> bool:
        return all(e in assigned and assigned[e] >= k for k, e in enumerate(p, 1))

    def too_many() -> bool:  # a pair already has two paths fully assigned and enabled
        return any(sum(on(p) for p in ps) > 1 for ps in paths.values())

    def step(i: int) -> dict[Edge, int] | None:
        if next(budget) > _SEARCH_LIMIT:
            return None
        if i == len(order):
            return dict(assigned) if all(sum(on(p) for p in ps) == 1 for ps in paths.values()) else None
        edge = order[i]
        for value in sorted({1, *positions[edge]}, reverse=True):
            assigned[edge] = value
            if not too_many():
                result = step(i + 1)
                if result is not None:
                    return result
            del assigned[edge]
        return None

    return step(0)


@dataclass(frozen=True)
class FederationTopology:
    """Brokers, links and the federated exchange; ``links`` carry the computed (or given) max_hops."""

    brokers: tuple[FederatedBroker, ...]
    links: tuple[Link, ...]
    exchange: str
    exchange_type: str = "topic"
    options: UpstreamOptions = UpstreamOptions()
    name: str = "smartclient"

    def __post_init__(self) -> None:
        _all_of("FederationTopology.brokers", self.brokers, FederatedBroker)
        _all_of("FederationTopology.links", self.links, Link)
        text("FederationTopology.exchange", self.exchange)
        choice("FederationTopology.exchange_type", self.exchange_type, EXCHANGE_TYPES)
        instance("FederationTopology.options", self.options, UpstreamOptions, optional=False)
        text("FederationTopology.name", self.name)
        names = [b.name for b in self.brokers]
        if len(names) < 2:
            raise ConfigurationError("federation needs at least two brokers")
        if len(set(names)) != len(names):
            raise ConfigurationError(f"broker names repeat: {sorted(n for n in names if names.count(n) > 1)}")
        if not _NAME.match(self.exchange) or self.exchange.startswith("amq."):
            raise ConfigurationError(f"exchange name {self.exchange!r}: 1-100 letters, digits or _.:-, not amq.*")
        if not _NAME.match(self.name):
            raise ConfigurationError(f"topology name {self.name!r}: use 1-100 letters, digits or _.:-")
        for link in self.links:
            for end in (link.upstream, link.downstream):
                if end not in names:
                    raise ConfigurationError(f"link {link.upstream} -> {link.downstream}: no broker named {end!r}")
            if link.upstream == link.downstream:
                raise ConfigurationError(f"a broker cannot federate from itself ({link.upstream})")
            if link.max_hops < 1:
                raise ConfigurationError(f"max_hops must be at least 1 ({link.upstream} -> {link.downstream})")
        linked = {e for link in self.links for e in (link.upstream, link.downstream)}
        isolated = [n for n in names if n not in linked]
        if isolated:
            raise ConfigurationError(f"brokers {isolated} have no link: nothing would reach them")

    def broker(self, name: str) -> FederatedBroker:
        for b in self.brokers:
            if b.name == name:
                return b
        raise ConfigurationError(f"no broker named {name!r} in this topology")

    def upstreams_of(self, downstream: str) -> list[Link]:
        return [link for link in self.links if link.downstream == downstream]

    def reachable(self, origin: str) -> set[str]:
        """The brokers a message published at ``origin`` reaches (not ``origin`` itself)."""
        out: dict[str, list[str]] = {}
        for link in self.links:
            out.setdefault(link.upstream, []).append(link.downstream)
        seen, todo = {origin}, deque([origin])
        while todo:
            for nxt in out.get(todo.popleft(), []):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen - {origin}

    def copies(self) -> dict[Edge, int]:
        """Copies of a message published at X that reach B, for every pair, under these links' max_hops."""
        return copies([(k.upstream, k.downstream) for k in self.links], [b.name for b in self.brokers],
                      {(k.upstream, k.downstream): k.max_hops for k in self.links})

    def with_max_hops(self, max_hops: int) -> FederationTopology:
        """The same links, every one with ``max_hops`` (to show what a wrong value does)."""
        from dataclasses import replace

        return replace(self, links=tuple(Link(k.upstream, k.downstream, max_hops) for k in self.links))


def graph(brokers: Sequence[FederatedBroker], edges: Iterable[Edge], exchange: str, **kw: object) -> FederationTopology:
    """Any graph of ``(upstream, downstream)`` links; max_hops computed (see :func:`compute_max_hops`)."""
    _all_of("brokers", brokers, FederatedBroker)
    text("exchange", exchange)
    edges = sorted(set(_edges("edges", edges)))
    names = [b.name for b in brokers]
    for u, d in edges:
        for end in (u, d):
            if end not in names:
                raise ConfigurationError(f"link {u} -> {d}: no broker named {end!r}")
    hops = compute_max_hops(edges, names)
    links = tuple(Link(u, d, hops[(u, d)]) for u, d in edges)
    return FederationTopology(tuple(brokers), links, exchange, **kw)  # type: ignore[arg-type]


def pair(a: FederatedBroker, b: FederatedBroker, exchange: str, **kw: object) -> FederationTopology:
    """Two brokers, each federating from the other (max_hops 1)."""
    instance("a", a, FederatedBroker, optional=False, what="a FederatedBroker (one end of the pair)")
    instance("b", b, FederatedBroker, optional=False, what="a FederatedBroker (the other end)")
    return graph([a, b], [(a.name, b.name), (b.name, a.name)], exchange, **kw)


def complete(brokers: Sequence[FederatedBroker], exchange: str, **kw: object) -> FederationTopology:
    """Every broker federates from every other (max_hops 1)."""
    _all_of("brokers", brokers, FederatedBroker)
    return graph(brokers, [(u.name, d.name) for u in brokers for d in brokers if u is not d], exchange, **kw)


def ring(brokers: Sequence[FederatedBroker], exchange: str, **kw: object) -> FederationTopology:
    """Broker *i* federates from broker *i-1* (messages go round one way; max_hops n-1)."""
    _all_of("brokers", brokers, FederatedBroker)
    n = len(brokers)
    if n < 3:
        raise ConfigurationError("a ring needs at least three brokers (two make a pair)")
    return graph(brokers, [(brokers[i - 1].name, brokers[i].name) for i in range(n)], exchange, **kw)


def fan_out(brokers: Sequence[FederatedBroker], tree: Mapping[str, Sequence[str]], exchange: str, *,
            both_ways: bool = False, **kw: object) -> FederationTopology:
    """A tree, ``{parent: [children]}``: children federate from their parent, so what is published at the
    root reaches every broker (max_hops = the depth).  ``both_ways``: parents federate from their children
    too, and every broker reaches every other.

    :raises ConfigurationError: not a tree (a broker with two parents, a cycle, or several roots).
    """
    _all_of("brokers", brokers, FederatedBroker)
    if not isinstance(tree, Mapping) or not all(isinstance(p, str) and isinstance(c, list | tuple) and all(
            isinstance(child, str) for child in c) for p, c in tree.items()):
        refuse("tree", "a mapping of each parent's name to the names of its children", tree)
    flag("both_ways", both_ways)
    parents: dict[str, str] = {}
    for parent, children in tree.items():
        for child in children:
            if child in parents:
                raise ConfigurationError(f"{child} has two parents ({parents[child]}, {parent}): not a tree")
            parents[child] = parent
    roots = {p for p in tree if p not in parents}
    if len(roots) != 1:
        raise ConfigurationError(f"a fan-out tree has exactly one root, not {sorted(roots) or 'none (a cycle)'}")
    edges = [(p, c) for c, p in parents.items()]
    if both_ways:
        edges += [(c, p) for p, c in list(edges)]
    return graph(brokers, edges, exchange, **kw)
