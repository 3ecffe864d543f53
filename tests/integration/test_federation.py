"""Federation against the test bed's independent brokers: each topology delivers every message exactly
once to every broker it reaches, a wrong max_hops shows (so the check can fail), link status follows a
stopped broker, applying twice changes nothing, and bad input is a typed error."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from smartclient import AuthenticationFailed, ConfigurationError, ConnectionFailed
from smartclient.federation.apply import apply, remove, status, wait_running
from smartclient.federation.topology import (
    FederatedBroker,
    FederationTopology,
    UpstreamOptions,
    complete,
    fan_out,
    graph,
    pair,
    ring,
)
from smartclient.management import ManagementClient, ManagementError
from smartclient.testing import TestBed

from ..conftest import wait_until_sync

pytestmark = pytest.mark.federation


@pytest.fixture(scope="module")
def brokers(rabbitmq_testbed: TestBed) -> Iterator[list[FederatedBroker]]:
    nodes = rabbitmq_testbed.start_brokers(4)  # FaultUnavailable on a test bed without independent brokers
    yield [FederatedBroker(n.short, n.management_url, f"amqp://guest:guest@{n.host}:{n.amqp_port}") for n in nodes]
    rabbitmq_testbed.stop_brokers()  # give the CPU back to the rest of the suite


def _api(broker: FederatedBroker) -> ManagementClient:
    return ManagementClient(broker.management_url, broker.username, broker.password)


class Delivery:
    """A queue bound to the federated exchange on every broker; publish and collect via the management API."""

    def __init__(self, topology: FederationTopology) -> None:
        self.topology = topology
        self.queue = f"fed-{uuid.uuid4().hex[:8]}"
        self.apis = {b.name: _api(b) for b in topology.brokers}
        for api in self.apis.values():
            api.put(f"/api/queues/%2F/{self.queue}", {"durable": True, "auto_delete": False})  # survives stop_app
            api.post(f"/api/bindings/%2F/e/{quote(topology.exchange)}/q/{self.queue}", {"routing_key": "#"})

    def publish(self, origin: str, payload: str) -> None:
        self.apis[origin].post(f"/api/exchanges/%2F/{quote(self.topology.exchange)}/publish",
                               {"properties": {}, "routing_key": "fed.test", "payload": payload,
                                "payload_encoding": "string"})

    def take(self, broker: str) -> list[str]:
        got = self.apis[broker].post(f"/api/queues/%2F/{self.queue}/get",
                                     {"count": 10_000, "ackmode": "ack_requeue_false", "encoding": "auto"})
        return [str(m["payload"]) for m in got]

    def delivered(self) -> dict[str, set[str]]:
        """The origins each broker should get a message from, under the links' max_hops (its own included)."""
        return {b.name: {b.name} | {o for (o, d), n in self.topology.copies().items() if d == b.name and n}
                for b in self.topology.brokers}

    def settle_bindings(self, timeout: float = 30.0) -> None:
        """Federation sends bindings upstream asynchronously: probe until every broker hears every origin
        whose messages reach it.  A probe arriving later is left in the queue: :meth:`round` counts only
        its own messages."""
        heard: dict[str, set[str]] = {b.name: set() for b in self.topology.brokers}
        want = self.delivered()

        def probed() -> bool:
            for b in heard:
                heard[b] |= {p.split(":", 1)[1] for p in self.take(b) if p.startswith("probe:")}
            if all(want[b] - {b} <= heard[b] for b in heard):
                return True
            for origin in self.apis:
                self.publish(origin, f"probe:{origin}")
            return False

        wait_until_sync(probed, timeout, f"bindings to reach every upstream (want {want})", interval=0.3)

    def round(self, settle: float = 1.5, wait: float = 15.0) -> dict[str, Counter[str]]:
        """One message from every broker; what each broker's queue got: once every message the links
        deliver (under their max_hops) has arrived, and then during ``settle`` s more."""
        tag = uuid.uuid4().hex[:6]
        for origin in self.apis:
            self.publish(origin, f"m:{tag}:{origin}")
        expected = self.delivered()
        got: dict[str, Counter[str]] = {b: Counter() for b in self.apis}

        def collect() -> dict[str, Counter[str]]:
            for b in got:
                got[b].update(p.rsplit(":", 1)[1] for p in self.take(b) if p.startswith(f"m:{tag}:"))
            return got

        wait_until_sync(lambda: all(set(collect()[b]) >= expected[b] for b in got), wait,
                        f"one message from every origin that reaches each broker (want {expected})", interval=0.2)
        # a window, not a wait: a late duplicate (a longer path round a ring) or a message beyond max_hops has
        # no condition to wait for; it would arrive now
        time.sleep(settle)
        return collect()

    def expected(self) -> dict[str, Counter[str]]:
        return {b.name: Counter({o.name: 1 for o in self.topology.brokers
                                 if o.name == b.name or b.name in self.topology.reachable(o.name)})
                for b in self.topology.brokers}

    def close(self) -> None:
        for api in self.apis.values():
            with contextlib.suppress(ManagementError):
                api.delete(f"/api/queues/%2F/{self.queue}")
            api.close()


@pytest.fixture
def applied() -> Iterator[Callable[..., tuple[FederationTopology, Delivery]]]:
    made: list[tuple[FederationTopology, Delivery]] = []

    def make(topology: FederationTopology, verify: bool = True) -> tuple[FederationTopology, Delivery]:
        apply(topology, verify=verify)
        wait_running(topology, timeout=30)
        delivery = Delivery(topology)
        made.append((topology, delivery))
        delivery.settle_bindings()
        return topology, delivery

    yield make
    for topology, delivery in made:
        delivery.close()
        remove(topology)


def _name() -> str:
    return f"fed-{uuid.uuid4().hex[:6]}"


TOPOLOGIES: dict[str, Callable[[list[FederatedBroker], str], FederationTopology]] = {
    "pair": lambda b, x: pair(b[0], b[1], x, name=x),
    "complete graph of 3": lambda b, x: complete(b[:3], x, name=x),
    "fan-out tree of depth 2": lambda b, x: fan_out(b[:4], {b[0].name: [b[1].name, b[2].name],
                                                             b[1].name: [b[3].name]}, x, name=x),
    "ring of 4": lambda b, x: ring(b[:4], x, name=x),
}


@pytest.mark.parametrize("kind", list(TOPOLOGIES))
def test_a_message_published_anywhere_reaches_every_broker_it_should_exactly_once(
    brokers: list[FederatedBroker], applied: Callable[..., tuple[FederationTopology, Delivery]], kind: str
) -> None:
    topology, delivery = applied(TOPOLOGIES[kind](brokers, _name()))
    got = delivery.round()
    assert got == delivery.expected(), f"{kind}: got {got}"
    if kind != "fan-out tree of depth 2":  # a one-way tree reaches the root's subtree; the rest reach all
        assert all(len(c) == len(topology.brokers) for c in got.values())


def test_a_ring_linked_both_ways_with_a_hand_picked_max_hops_duplicates_and_the_computed_one_does_not(
    brokers: list[FederatedBroker], applied: Callable[..., tuple[FederationTopology, Delivery]]
) -> None:
    names = [b.name for b in brokers[:4]]
    edges = [(names[i], names[(i + 1) % 4]) for i in range(4)] + [(names[(i + 1) % 4], names[i]) for i in range(4)]
    computed = graph(brokers[:4], edges, x := _name(), name=x)
    by_hand = computed.with_max_hops(2)  # "the longest path is 2": what an operator would write
    with pytest.raises(ConfigurationError, match=r"reaches .* 2 times, not once"):
        apply(by_hand)  # refused unless asked for
    _, wrong = applied(by_hand, verify=False)
    got = wrong.round()
    assert any(n == 2 for c in got.values() for n in c.values()), f"expected duplicates, got {got}"
    apply(computed)  # the same links, per-link max_hops
    wait_running(computed)
    wrong.settle_bindings()
    assert wrong.round() == wrong.expected()


def test_a_ring_with_too_small_a_max_hops_misses_the_far_broker(
    brokers: list[FederatedBroker], applied: Callable[..., tuple[FederationTopology, Delivery]]
) -> None:
    topology = ring(brokers[:4], x := _name(), name=x).with_max_hops(2)
    apply(topology, verify=False)
    wait_running(topology)
    delivery = Delivery(topology)
    try:
        delivery.settle_bindings()  # the links that do deliver, under max_hops 2
        got = delivery.round(settle=1.0)
        assert got != delivery.expected()
        assert any(len(c) == 3 for c in got.values())  # each broker misses the one three links away
    finally:
        delivery.close()
        remove(topology)


@pytest.mark.faults
def test_stopping_a_broker_shows_its_links_down_and_they_recover(
    rabbitmq_testbed: TestBed, brokers: list[FederatedBroker],
    applied: Callable[..., tuple[FederationTopology, Delivery]],
) -> None:
    topology, delivery = applied(ring(brokers[:4], x := _name(), name=x))
    stopped = brokers[2].name
    # kill -9, not stop_app: RabbitMQ 4.0.5's stop_app can wait minutes on a federation link's shutdown
    # (its supervisor allows it 300 s), which once outlasted the test bed's 60 s
    rabbitmq_testbed.kill_node(stopped)
    try:
        def shown_down() -> dict[tuple[str, str], Any] | None:
            links = {(k.upstream, k.downstream): k for k in status(topology)}
            down = {pair for pair, k in links.items() if not k.running}
            return links if {(stopped, brokers[3].name), (brokers[1].name, stopped)} <= down else None

        links = wait_until_sync(shown_down, 30, f"the links to and from {stopped} to show down", interval=0.5)
        assert links[(brokers[1].name, stopped)].status == "unknown"  # its own API is down with it
        assert links[(stopped, brokers[3].name)].status in ("starting", "error", "shutdown")
        assert links[(brokers[0].name, brokers[1].name)].running  # the rest of the ring is unaffected
    finally:
        rabbitmq_testbed.restart_node(stopped)
    assert all(k.running for k in wait_running(topology, timeout=60))
    delivery.settle_bindings(timeout=60)
    assert delivery.round() == delivery.expected()


def test_applying_twice_changes_nothing_and_options_reach_the_broker(brokers: list[FederatedBroker]) -> None:
    options = UpstreamOptions(prefetch_count=50, reconnect_delay=2, heartbeat=10, expires=600_000, message_ttl=30_000)
    topology = pair(brokers[0], brokers[1], x := _name(), name=x, options=options)
    try:
        first = apply(topology)
        # each broker: its upstream, set and policy (the exchange too, unless a link declared it first)
        for b in brokers[:2]:
            assert {f"{b.name}: upstream set {x}", f"{b.name}: policy {x}-federation"} <= set(first.changes)
        assert apply(topology).changes == []
        with _api(brokers[1]) as api:
            value = api.get(f"/api/parameters/federation-upstream/%2F/{x}-{brokers[0].name}")["value"]
        assert value["prefetch-count"] == 50 and value["reconnect-delay"] == 2 and value["max-hops"] == 1
        assert value["expires"] == 600_000 and value["message-ttl"] == 30_000 and value["uri"].endswith("?heartbeat=10")
        wait_running(topology)
    finally:
        removed = remove(topology)
    assert removed.changed and remove(topology).changes == []
    with _api(brokers[1]) as api:
        assert not [p for p in api.get("/api/policies/%2F") if p["name"].startswith(x)]


def test_unreachable_brokers_and_bad_credentials_are_typed_errors_before_any_write(
    brokers: list[FederatedBroker],
) -> None:
    dead = FederatedBroker("nowhere", "http://127.0.0.1:9", "amqp://guest:guest@127.0.0.1:9")
    topology = pair(brokers[0], dead, x := _name(), name=x)
    with pytest.raises(ConnectionFailed, match=r"broker nowhere: the management API at http://127\.0\.0\.1:9"):
        apply(topology)
    with _api(brokers[0]) as api:
        assert not [p for p in api.get("/api/policies/%2F") if p["name"].startswith(x)]  # nothing written
    wrong = FederatedBroker(brokers[1].name, brokers[1].management_url, brokers[1].amqp_uri, password="nope")
    with pytest.raises(AuthenticationFailed, match=f"broker {brokers[1].name}: the management API refused"):
        apply(pair(brokers[0], wrong, x, name=x))


def test_brokers_sharing_a_cluster_name_are_refused(brokers: list[FederatedBroker]) -> None:
    with _api(brokers[1]) as api:
        original = api.get("/api/cluster-name")["name"]
        with _api(brokers[0]) as first:
            api.put("/api/cluster-name", {"name": first.get("/api/cluster-name")["name"]})
        try:
            with pytest.raises(ConfigurationError, match="cycle detection tells brokers apart by cluster name"):
                apply(pair(brokers[0], brokers[1], x := _name(), name=x))
        finally:
            api.put("/api/cluster-name", {"name": original})


def test_an_environment_hands_its_cluster_to_a_topology_as_one_broker(
    brokers: list[FederatedBroker], applied: Callable[..., tuple[FederationTopology, Delivery]]
) -> None:
    from smartclient import Environment

    first = brokers[0]
    env = Environment("rabbitmq-stream://guest:guest@127.0.0.1:1/", management=_api(first))  # never started
    mine = env.federated_broker(first.name, first.amqp_uri)
    assert mine == first  # its management API, that API's credentials and the vhost, from the Environment
    exchange = _name()
    _topology, delivery = applied(pair(mine, brokers[1], exchange, name=exchange))
    assert delivery.round() == delivery.expected()
