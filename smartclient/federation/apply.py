"""Apply a :class:`~smartclient.federation.topology.FederationTopology` to its brokers, read its links'
status, tear it down.  Through each broker's management HTTP API, the modern form of the seed's static
``rabbitmq_federation`` config:

* on every broker: the exchange (durable, of the topology's type);
* on every broker with upstreams: one ``federation-upstream`` parameter per link (its URI, the exchange,
  the link's computed ``max-hops``, and the upstream options), a ``federation-upstream-set`` naming them,
  and a policy that applies the set to the exchange.

Applying compares what each broker has first and writes only what differs, so applying twice changes
nothing (the :class:`ApplyReport` lists the writes).  Before writing anything, every broker's management
API is checked (reachable, credentials, the federation plugin, the exchange type) and so are the cluster
names: federation's cycle detection tells brokers apart by cluster name, so two brokers with the same
name would pass messages round a loop.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from smartclient._errors import (
    AuthenticationFailed,
    ConfigurationError,
    ConnectionFailed,
    FeatureNotSupported,
    TopologyError,
)
from smartclient.core.retry import Backoff
from smartclient.core.validation import flag, instance, number
from smartclient.federation.topology import FederatedBroker, FederationTopology
from smartclient.management import ManagementClient, ManagementError

__all__ = ["ApplyReport", "LinkStatus", "apply", "remove", "status", "wait_running"]

# how often wait_running reads the links' status: each read asks every broker's management API, so 4 times a second
LINK_POLL = Backoff.steady(0.25)


@dataclass
class ApplyReport:
    """What :func:`apply` or :func:`remove` wrote: ``"<broker>: <what>"`` lines; empty when nothing changed."""

    changes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


@dataclass(frozen=True)
class LinkStatus:
    """One link as its downstream broker reports it.

    ``status``: ``running``, ``starting``, ``error`` or ``shutdown`` (from the broker), ``absent`` (the broker
    lists no such link) or ``unknown`` (the broker's management API did not answer)."""

    upstream: str
    downstream: str
    status: str
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"


def _topology(topology: object) -> None:
    instance("topology", topology, FederationTopology, optional=False, what="a FederationTopology (pair(), ring()...)")


def _upstream_name(topology: FederationTopology, upstream: str) -> str:
    return f"{topology.name}-{upstream}"


class _Broker:
    """One broker's management API; every failure becomes a typed error that names the broker."""

    def __init__(self, broker: FederatedBroker) -> None:
        self.broker = broker
        self.vhost = quote(broker.vhost, safe="")
        self.api = ManagementClient(broker.management_url, broker.username, broker.password)

    def _do(self, what: str, method: str, path: str, body: Any = None) -> Any:
        b = self.broker
        try:
            if method == "GET":
                return self.api.get(path)
            if method == "PUT":
                return self.api.put(path, body)
            return self.api.delete(path)
        except AuthenticationFailed as exc:
            raise AuthenticationFailed(
                f"broker {b.name}: the management API refused the credentials of {b.username!r} ({what})"
            ) from exc
        except ManagementError as exc:
            if exc.status == 404 and method in ("GET", "DELETE"):
                return None
            if exc.status is None:
                raise ConnectionFailed(
                    f"broker {b.name}: the management API at {b.management_url} did not answer ({what}): {exc}"
                ) from exc
            raise

    def get(self, path: str, what: str = "reading") -> Any:
        """The resource, or None if there is none (404)."""
        return self._do(what, "GET", path)

    def put(self, path: str, body: Any, what: str = "writing") -> None:
        self._do(what, "PUT", path, body)

    def delete(self, path: str, what: str = "removing") -> None:
        self._do(what, "DELETE", path)

    def close(self) -> None:
        self.api.close()


@contextmanager
def _api(broker: FederatedBroker) -> Iterator[_Broker]:
    api = _Broker(broker)
    try:
        yield api
    finally:
        api.close()


def preflight(topology: FederationTopology) -> None:
    """Check every broker before anything is written.

    :raises ConnectionFailed: a management API did not answer.  :raises AuthenticationFailed: refused.
    :raises FeatureNotSupported: no federation plugin.  :raises ConfigurationError: the exchange type is
        unknown to a broker, an exchange of that name has another type, or two brokers share a cluster name.
    """
    names: dict[str, str] = {}
    for broker in topology.brokers:
        with _api(broker) as api:
            overview = api.get("/api/overview", "reading the overview") or {}
            types = {t["name"] for t in overview.get("exchange_types", [])}
            if "x-federation-upstream" not in types:
                raise FeatureNotSupported(f"broker {broker.name} has no federation plugin (rabbitmq_federation)")
            if topology.exchange_type not in types:
                raise ConfigurationError(f"broker {broker.name} knows no exchange type {topology.exchange_type!r}")
            existing = api.get(f"/api/exchanges/{api.vhost}/{quote(topology.exchange)}", "reading the exchange")
            if existing is not None and existing.get("type") != topology.exchange_type:
                raise ConfigurationError(
                    f"broker {broker.name} already has exchange {topology.exchange!r} of type "
                    f"{existing.get('type')!r}, not {topology.exchange_type!r}"
                )
            cluster = (api.get("/api/cluster-name", "reading the cluster name") or {}).get("name", broker.name)
            if cluster in names:
                raise ConfigurationError(
                    f"brokers {names[cluster]} and {broker.name} are both called {cluster!r}: federation's cycle "
                    f"detection tells brokers apart by cluster name; rename one (rabbitmqctl set_cluster_name)"
                )
            names[cluster] = broker.name


def _desired(topology: FederationTopology, broker: FederatedBroker) -> dict[str, tuple[str, Any]]:
    """path -> (kind, body) of everything ``broker`` should have."""
    v = quote(broker.vhost, safe="")
    out: dict[str, tuple[str, Any]] = {
        f"/api/exchanges/{v}/{quote(topology.exchange)}": ("exchange", {"type": topology.exchange_type,
                                                                           "durable": True, "auto_delete": False}),
    }
    links = topology.upstreams_of(broker.name)
    if not links:
        return out
    for link in links:
        upstream = topology.broker(link.upstream)
        value = {"uri": topology.options.uri(upstream.amqp_uri), "exchange": topology.exchange,
                 "max-hops": link.max_hops, **topology.options.value()}
        name = _upstream_name(topology, link.upstream)
        out[f"/api/parameters/federation-upstream/{v}/{quote(name)}"] = ("upstream", {"value": value})
    members = [{"upstream": _upstream_name(topology, k.upstream)} for k in links]
    out[f"/api/parameters/federation-upstream-set/{v}/{quote(topology.name)}"] = ("upstream set", {"value": members})
    out[f"/api/policies/{v}/{quote(topology.name + '-federation')}"] = ("policy", {
        "pattern": f"^{re.escape(topology.exchange)}$", "apply-to": "exchanges", "priority": 10,
        "definition": {"federation-upstream-set": topology.name},
    })
    return out


def _same(kind: str, have: Any, want: Any) -> bool:
    if have is None:
        return False
    if kind == "exchange":
        return bool(have.get("type") == want["type"] and have.get("durable") is True)
    if kind == "policy":
        return all(have.get(k) == want[k] for k in ("pattern", "apply-to", "priority", "definition"))
    return bool(have.get("value") == want["value"])


def apply(topology: FederationTopology, *, verify: bool = True) -> ApplyReport:
    """Make every broker match ``topology``; only differences are written.

    :param verify: refuse a topology whose links' max_hops do not give exactly-once delivery (pass False
        only to show what a wrong value does).
    :raises ConfigurationError: the topology is not exactly-once (with ``verify``), or see :func:`preflight`.
    """
    _topology(topology)
    flag("verify", verify)
    if verify:
        wrong = {pair: n for pair, n in topology.copies().items() if n > 1 or
                 (n == 0 and pair[1] in topology.reachable(pair[0]))}
        if wrong:
            (x, b), n = sorted(wrong.items())[0]
            raise ConfigurationError(
                f"with these max_hops a message published at {x} reaches {b} {n} times, not once "
                f"({len(wrong)} such pairs); build the topology with pair/complete/ring/fan_out/graph"
            )
    preflight(topology)
    report = ApplyReport()
    for broker in topology.brokers:
        with _api(broker) as api:
            desired = _desired(topology, broker)
            for path, (kind, body) in desired.items():
                have = api.get(path, f"reading the {kind}")
                if not _same(kind, have, body):
                    api.put(path, body, f"writing the {kind}")
                    report.changes.append(f"{broker.name}: {kind} {path.rsplit('/', 1)[-1]}")
            # upstreams of this topology that are no longer wanted (a link removed since the last apply)
            wanted = {p for p, (kind, _) in desired.items() if kind == "upstream"}
            for path in _own_upstreams(api, topology) - wanted:
                api.delete(path, "removing an upstream")
                report.changes.append(f"{broker.name}: removed upstream {path.rsplit('/', 1)[-1]}")
    return report


def _own_upstreams(api: _Broker, topology: FederationTopology) -> set[str]:
    """The upstream parameters this topology made on the broker (named ``<topology>-<broker>``)."""
    rows = api.get(f"/api/parameters/federation-upstream/{api.vhost}") or []
    names = {_upstream_name(topology, b.name) for b in topology.brokers}
    base = f"/api/parameters/federation-upstream/{api.vhost}"
    return {f"{base}/{quote(r['name'])}" for r in rows if r.get("name") in names}


def remove(topology: FederationTopology, *, exchanges: bool = True) -> ApplyReport:
    """Delete the policy, upstream set and upstreams of ``topology`` on every broker that answers, and (with
    ``exchanges``) the exchanges.  Missing pieces are skipped."""
    _topology(topology)
    flag("exchanges", exchanges)
    report = ApplyReport()
    for broker in topology.brokers:
        with _api(broker) as api:
            desired = _desired(topology, broker)
            paths = [p for p, (k, _) in desired.items() if k == "policy"]
            paths += [p for p, (k, _) in desired.items() if k == "upstream set"]
            paths += sorted(_own_upstreams(api, topology) | {p for p, (k, _) in desired.items() if k == "upstream"})
            if exchanges:
                paths += [p for p, (k, _) in desired.items() if k == "exchange"]
            for path in paths:
                if api.get(path) is not None:
                    api.delete(path)
                    report.changes.append(f"{broker.name}: removed {path.rsplit('/', 1)[-1]}")
    return report


def status(topology: FederationTopology) -> list[LinkStatus]:
    """Every link of ``topology`` as its downstream broker reports it (``GET /api/federation-links``)."""
    _topology(topology)
    out: list[LinkStatus] = []
    for broker in topology.brokers:
        links = topology.upstreams_of(broker.name)
        if not links:
            continue
        try:
            with _api(broker) as api:
                rows = api.get(f"/api/federation-links/{api.vhost}", "reading federation links")
        except (ConnectionFailed, ManagementError) as exc:
            out += [LinkStatus(k.upstream, k.downstream, "unknown", str(exc)) for k in links]
            continue
        if rows is None:
            raise FeatureNotSupported(f"broker {broker.name} has no federation management plugin")
        by_upstream = {str(r.get("upstream")): r for r in rows
                       if r.get("exchange") == topology.exchange and r.get("type", "exchange") == "exchange"}
        for link in links:
            row = by_upstream.get(_upstream_name(topology, link.upstream))
            if row is None:
                out.append(LinkStatus(link.upstream, link.downstream, "absent"))
            else:
                error = row.get("error")
                out.append(LinkStatus(link.upstream, link.downstream, str(row.get("status")),
                                      None if error in (None, "") else str(error)))
    return out


def wait_running(topology: FederationTopology, timeout: float = 30.0) -> list[LinkStatus]:
    """Wait until every link is running; return their status.

    :raises TopologyError: some link was not running within ``timeout`` seconds (the message lists them)."""
    _topology(topology)
    number("timeout", timeout, above=0, note="seconds")
    deadline = time.monotonic() + timeout
    polls = LINK_POLL.delays()
    while True:
        links = status(topology)
        if all(link.running for link in links):
            return links
        if time.monotonic() >= deadline:
            down = [f"{k.upstream} -> {k.downstream}: {k.status}{f' ({k.error})' if k.error else ''}"
                    for k in links if not k.running]
            raise TopologyError(f"federation links not running after {timeout} s: {'; '.join(down)}")
        time.sleep(next(polls))
