"""SniRouter: the name rule (what string the rule receives, what it may answer), the one resolution seam through
an SNI ingress, and the misroute decision, alone and driven by the stream shell and the AMQP/MQTT placer over a
fake network.  No broker (tests/integration/test_sni_placement.py runs it against the test bed's HAProxy)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest

from resolvers import Chain, Identity, LoadBalancer, SniRouter, StaticMap
from smartclient import (
    Address,
    CertificateRejected,
    ConfigurationError,
    ConnectionFailed,
    Misrouted,
    PlacementError,
    ResolutionError,
    RetryPolicy,
    StreamTopology,
)
from smartclient.core.broker_nodes import BrokerNode
from smartclient.core.landing import Dial, Done, GiveUp, Placement, Reject, Routed, misroute
from smartclient.core.settings import Credentials, PoolLimits
from smartclient.core.tls_names import default_sni_name, tls_server_name
from smartclient.core.topology import Candidates, Role
from smartclient.node_placement import Landed, NodePlacer
from smartclient.options import ClientSettings
from smartclient.resolution import Resolution
from smartclient.stream.connector import StreamConnector
from smartclient.stream.host import Connection
from tests.conftest import bed_name
from tests.unit.fakes import FakeClient

INGRESS = Address("ingress.example", 5551)
N1, N2, N3 = (Address(f"rabbit-{i}.example", 5551) for i in (1, 2, 3))
FAST = RetryPolicy(backoff_initial=0.0, backoff_max=0.0, max_attempts=6, hedge_after=0)
TLS = ssl.create_default_context()


# -- the name rule -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("node, expected", [
    ("rabbit@rabbit-server-0.rabbit-nodes.ns", "rabbit-server-0.rabbit-nodes.ns"),  # Kubernetes: the pod's name
    ("rabbit-server-0.rabbit-nodes.ns", "rabbit-server-0.rabbit-nodes.ns"),  # what the same pod advertises
    ("rabbit-1@localhost", "localhost"),
])
def test_the_default_rule_is_the_host_of_an_erlang_name_and_any_other_string_as_it_is(node: str, expected: str) -> None:
    assert default_sni_name(node) == expected
    assert SniRouter(INGRESS).sni_name(node) == expected


def test_a_rule_receives_the_erlang_name_or_the_advertised_host_and_may_name_both_alike() -> None:
    seen: list[str] = []

    def rule(node: str) -> str:
        seen.append(node)
        return bed_name(node)

    router = SniRouter(INGRESS, name=rule)
    assert router.sni_name("rabbit-2@localhost") == router.sni_name("rabbit-2.smartclient.test") == \
        "rabbit-2.smartclient.test"
    assert seen == ["rabbit-2@localhost", "rabbit-2.smartclient.test"]


def test_a_rule_of_two_arguments_is_told_the_protocol_for_an_ingress_with_one_port_for_all() -> None:
    router = SniRouter("ingress.example:443", amqp=443, mqtt_tls=443,
                       name=lambda node, protocol: f"{protocol}-{bed_name(node)}")
    target = Address("localhost", 20172)
    names = {protocol: Resolution(router, tls=True, protocol=protocol).tls_name(target, INGRESS, "rabbit-1@localhost")
             for protocol in ("amqp", "amqp/ssl", "mqtt/ssl")}
    assert names == {"amqp": "amqp-rabbit-1.smartclient.test", "amqp/ssl": "amqp-rabbit-1.smartclient.test",
                     "mqtt/ssl": "mqtt-rabbit-1.smartclient.test"}
    assert Resolution(router, tls=True).tls_name(N1, INGRESS) == "stream-rabbit-1.smartclient.test"
    assert SniRouter(INGRESS, name=str.upper).sni_name("rabbit-1.example", "amqp") == "RABBIT-1.EXAMPLE"  # builtin


@pytest.mark.parametrize("answer, problem", [
    ("10.0.0.5", "an IP address"), ("::1", "an IP address"), ("", "no usable host name"), (5, "int, not a str"),
    ("rabbit 1", "not a DNS name"), ("rabbit-1@localhost", "not a DNS name"),
])
def test_a_rule_that_answers_no_dns_name_is_a_resolution_error_naming_the_node(answer: Any, problem: str) -> None:
    router = SniRouter(INGRESS, name=lambda node: answer)
    with pytest.raises(ResolutionError, match=problem) as caught:
        router.sni_name("rabbit-1@localhost")
    assert "'rabbit-1@localhost'" in str(caught.value)


def test_a_rule_that_raises_is_a_resolution_error() -> None:
    router = SniRouter(INGRESS, name=lambda node: {}[node])
    with pytest.raises(ResolutionError, match=r"the name function failed on node 'n@h': KeyError"):
        router.sni_name("n@h")


# -- the value -----------------------------------------------------------------------------------------------------
def test_listeners_per_protocol_a_port_on_the_same_host_or_host_port() -> None:
    router = SniRouter("ingress.example:5551", amqp=5671, mqtt_tls="mqtt.example:8883")
    assert router.resolve(N1) == INGRESS and router.address_for("stream") == INGRESS
    assert router.address_for("amqp") == router.address_for("amqp/ssl") == Address("ingress.example", 5671)
    assert router.address_for("mqtt/ssl") == router.address_for("mqtt") == Address("mqtt.example", 8883)  # TLS only
    assert repr(router) == ("SniRouter('ingress.example:5551', amqp='ingress.example:5671', "
                            "mqtt_tls='mqtt.example:8883')")
    assert router == SniRouter(INGRESS, amqp=Address("ingress.example", 5671), mqtt_tls=Address("mqtt.example", 8883))
    assert hash(router) == hash(SniRouter(INGRESS, amqp=5671, mqtt_tls="mqtt.example:8883"))
    assert router != SniRouter(INGRESS, name=bed_name, amqp=5671, mqtt_tls="mqtt.example:8883")
    assert "name=bed_name" in repr(SniRouter(INGRESS, name=bed_name))


@pytest.mark.parametrize("kwargs, match", [
    ({"address": 5551}, "address must be 'host:port' or an Address"),
    ({"address": "ingress"}, "has no port"),
    ({"address": INGRESS, "name": "rabbit.example"},
     r"name must be a function \(a node's name, and maybe the protocol\) or None"),
    ({"address": INGRESS, "amqp": 70000}, "the SNI ingress's amqp listener must be"),
    ({"address": INGRESS, "mqtt_tls": -1}, "the SNI ingress's mqtt_tls listener must be"),
])
def test_bad_options_are_configuration_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SniRouter(**kwargs)


def test_a_chain_refuses_it() -> None:
    with pytest.raises(ConfigurationError, match=r"resolver 1 of the Chain, SniRouter.*not in a Chain"):
        Chain(Identity(), SniRouter(INGRESS))


# -- the one resolution seam ---------------------------------------------------------------------------------------
def test_tls_sends_the_nodes_name_whatever_was_dialled_and_before_any_other_rule() -> None:
    router = SniRouter(INGRESS, name=bed_name)
    assert tls_server_name(N2, INGRESS, router) == "rabbit-2.smartclient.test"  # a stream target: its host
    assert tls_server_name(Address("localhost", 20171), INGRESS, router, node="rabbit-3@localhost") == \
        "rabbit-3.smartclient.test"
    assert tls_server_name(N2, INGRESS, LoadBalancer(INGRESS)) == "ingress.example"  # unchanged for the others
    assert tls_server_name(N2, Address("10.0.0.2", 1), StaticMap({})) == "rabbit-2.example"


def test_the_resolution_dials_the_ingress_for_every_target_and_is_no_load_balancer() -> None:
    router = SniRouter(INGRESS, name=bed_name, amqp=5671)
    amqp = Resolution(router, tls=True, protocol="amqp")
    assert amqp.lb is None and amqp.listener == Address("ingress.example", 5671) and amqp.by_name is router
    route = amqp.route_sync(Address("localhost", 20172), node="rabbit-2@localhost")
    assert route.dial == Address("ingress.example", 5671) and route.tls_name == "rabbit-2.smartclient.test"
    # the AMQP/MQTT placer names the node at a target through the hook; without it the target's host stands in
    amqp.node_named = {Address("localhost", 20372): "rabbit-3@localhost"}.get
    assert amqp.tls_name(Address("localhost", 20372), INGRESS) == "rabbit-3.smartclient.test"
    assert amqp.routed(Address("localhost", 20372)) == Routed("rabbit-3.smartclient.test", "rabbit-3@localhost")
    streams = Resolution(router, tls=True)
    route = asyncio.run(streams.route(N1))
    assert route.dial == INGRESS and route.tls_name == "rabbit-1.smartclient.test"
    assert Resolution(LoadBalancer(INGRESS), tls=True).routed(N1) is None


@pytest.mark.parametrize("kwargs, match", [
    ({"tls": False}, r"routes each connection by the name in its TLS hello \(SNI\): give tls="),
    ({"tls": True, "tls_override": "rabbit.example"}, "would send one SNI name for every node"),
    ({"tls": True, "protocol": "amqp"}, r"has no amqp listener: SniRouter\(\.\.\., amqp=PORT\)"),
    ({"tls": True, "protocol": "mqtt/ssl"}, r"has no mqtt/ssl listener: SniRouter\(\.\.\., mqtt_tls=PORT\)"),
])
def test_the_resolution_refuses_what_could_not_route(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Resolution(SniRouter(INGRESS), **kwargs)


def test_a_rejected_certificate_names_the_sni_name_and_says_the_ingress_may_have_misrouted_it() -> None:
    resolution = Resolution(SniRouter(INGRESS, name=bed_name), tls=True)
    with pytest.raises(CertificateRejected) as caught, resolution.routing_errors(N1):
        raise CertificateRejected("connecting to ingress.example:5551: TLS certificate verify failed: mismatch")
    text = str(caught.value)
    assert "'rabbit-1.smartclient.test', the SNI name sent for node rabbit-1.example:5551" in text
    assert "the ingress may have misrouted it" in text and isinstance(caught.value.__cause__, CertificateRejected)
    plain = CertificateRejected("x")
    with pytest.raises(CertificateRejected) as caught, Resolution(Identity(), tls=True).routing_errors(N1):
        raise plain
    assert caught.value is plain  # not through an SNI ingress: untouched


def test_a_failed_dial_through_the_ingress_names_the_sni_name_and_stays_a_connection_failure() -> None:
    resolution = Resolution(SniRouter(INGRESS, name=bed_name), tls=True)
    with pytest.raises(ConnectionFailed) as caught, resolution.routing_errors(N2, "rabbit-2@localhost"):
        raise ConnectionFailed("connecting to ingress.example:5551: SSLEOFError: EOF")
    assert type(caught.value) is ConnectionFailed and str(caught.value) == (
        "connecting to ingress.example:5551: SSLEOFError: EOF (sent the SNI name 'rabbit-2.smartclient.test' for "
        "node rabbit-2@localhost: the ingress may have no route to it)")
    refused = Misrouted("x")  # a subclass (a refusal, a misroute) keeps its type and text
    with pytest.raises(Misrouted) as caught, resolution.routing_errors(N2):
        raise refused
    assert caught.value is refused


# -- the misroute decision ---------------------------------------------------------------------------------------
def test_reaching_another_node_than_the_name_sent_is_misrouted_naming_all_three() -> None:
    routed = Routed("rabbit-1.smartclient.test", "rabbit-1@localhost", "rabbit-2@localhost")
    assert misroute(routed, N1, INGRESS, N1) is None
    error = misroute(routed, N1, INGRESS, N2)
    assert isinstance(error, Misrouted) and isinstance(error, ConnectionFailed)
    assert str(error) == (
        "misrouted by the ingress at ingress.example:5551: the connection sent the SNI name "
        "'rabbit-1.smartclient.test' for node rabbit-1@localhost (rabbit-1.example:5551) and reached node "
        "rabbit-2@localhost (rabbit-2.example:5551); it was closed, never used as rabbit-2@localhost")
    assert "for node rabbit-1.example:5551 and reached node rabbit-2.example:5551" in str(
        misroute(Routed("rabbit-1.example"), N1, INGRESS, N2))


def test_a_misrouted_landing_is_rejected_even_on_another_candidate_and_the_next_candidate_is_dialled() -> None:
    consumer = StreamTopology("s", N1, (N2, N3)).candidates(Role.CONSUMER, load={N2: 0, N3: 0})
    plan: Placement[str] = Placement(consumer, FAST)
    step = plan.start()
    assert step == Dial(N2)
    rejected = plan.landed(N2, INGRESS, N3, "c1", Routed("rabbit-2.example"))  # N3 is a candidate: still no
    assert isinstance(rejected, Reject) and (rejected.connection, rejected.target, rejected.node) == ("c1", N2, N3)
    assert plan.landing.attempts[-1].reported == N3 and "failed: Misrouted" in plan.landing.attempts[-1].outcome
    assert plan.next() == Dial(N3)  # as after a failed attempt
    assert plan.landed(N3, INGRESS, N3, "c2", Routed("rabbit-3.example")) == Done("c2")
    assert Placement(consumer, FAST).landed(N2, INGRESS, N3, "c3") == Done("c3")  # unrouted: any tier-0 node


def test_when_every_attempt_is_misrouted_the_final_error_says_so() -> None:
    plan: Placement[str] = Placement(Candidates("s", Role.PRODUCER, ((N1,),)), RetryPolicy(max_attempts=2))
    plan.start()
    assert isinstance(plan.landed(N1, INGRESS, N2, "c1", Routed("rabbit-1.example")), Reject)
    plan.next()
    assert isinstance(plan.landed(N1, INGRESS, N2, "c2", Routed("rabbit-1.example")), Reject)
    gave_up = plan.next()
    assert isinstance(gave_up, GiveUp) and type(gave_up.error) is PlacementError
    assert "2 of the connections were misrouted" in str(gave_up.error)
    assert "2x dialled ingress.example:5551 for rabbit-1.example:5551: reached rabbit-2.example:5551, failed: " \
           "Misrouted" in str(gave_up.error)
    assert isinstance(gave_up.error.__cause__, Misrouted)


# -- driven by the stream shell (node from the Open response) ----------------------------------------------------
class IngressStreamConnector(StreamConnector):
    """The real stream shell behind an SNI ingress that sends ``misroutes[name]`` to another node."""

    def __init__(self, misroutes: dict[str, Address]) -> None:
        super().__init__(ClientSettings(Credentials(), "/", TLS), Resolution(SniRouter(INGRESS), tls=True),
                         retry=FAST, limits=PoolLimits(idle_timeout=60))
        self.misroutes = misroutes
        self.sent: list[str] = []

    async def dial(self, target: Address, name: str, client_class: Any = None) -> Connection:
        route = await self.resolution.route(target)
        assert route.dial == INGRESS and route.tls_name is not None
        self.sent.append(route.tls_name)
        self.opened += 1
        conn = Connection(FakeClient(), self.misroutes.get(route.tls_name, target), route.dial, f"{name}-{self.opened}")
        self.connections.add(conn)
        return conn


def test_the_stream_shell_closes_a_misrouted_connection_counts_it_and_places_on_the_next_candidate() -> None:
    connector = IngressStreamConnector({"rabbit-2.example": N1})  # the route of rabbit-2 reaches the leader
    consumer = StreamTopology("s", N1, (N2, N3)).candidates(Role.CONSUMER, load={N2: 0, N3: 0})
    conn = asyncio.run(connector.acquire(consumer, "test"))
    assert conn.node == N3 and connector.sent == ["rabbit-2.example", "rabbit-3.example"]
    assert connector.mismatches == {"misrouted": 1} and len(connector.parking) == 0  # closed, not parked
    assert [c.node for c in connector.connections] == [N3]


def test_the_stream_shell_never_uses_a_misrouted_connection_as_the_node_it_claims() -> None:
    connector = IngressStreamConnector({"rabbit-1.example": N2})
    producer = StreamTopology("s", N1, (N2, N3)).candidates(Role.PRODUCER)
    with pytest.raises(PlacementError, match="misrouted") as caught:
        asyncio.run(connector.acquire(producer, "test"))
    assert isinstance(caught.value.__cause__, Misrouted)
    assert connector.opened == FAST.max_attempts == connector.mismatches["misrouted"]
    assert not connector.connections and len(connector.parking) == 0


def test_the_stream_shell_lands_on_the_first_try_through_a_good_ingress() -> None:
    connector = IngressStreamConnector({})
    for candidates in (StreamTopology("s", N2, (N1, N3)).candidates(Role.PRODUCER),
                       StreamTopology("s", N1, (N2, N3)).candidates(Role.CONSUMER, load={N2: 1, N3: 0})):
        conn = asyncio.run(connector.acquire(candidates, "test"))
        assert conn.node == candidates.tiers[0][0] and conn.sessions == 1
    assert connector.opened == 2 and not connector.mismatches


# -- driven by the AMQP/MQTT placer (node from the management API) ------------------------------------------------
LISTENERS = {f"rabbit-{i}@localhost": Address("localhost", 20072 + 100 * i) for i in (1, 2, 3)}


class IngressPlacer(NodePlacer[str]):
    """The real AMQP/MQTT shell behind an SNI ingress (the management API and the dial simulated): the name each
    connection sends is the one ``_dial`` would give TLS, through the seam's node hook."""

    protocol = "amqp"
    default_port = 5672
    name_column = "name"

    def __init__(self, misroutes: dict[str, str]) -> None:
        super().__init__(None, settings=ClientSettings(resolver=SniRouter(INGRESS, name=bed_name, amqp=5671), tls=TLS,
                                                       retry=FAST))
        self._nodes = [BrokerNode(name, {"amqp": address}) for name, address in LISTENERS.items()]
        self.misroutes = misroutes
        self.sent: list[str] = []
        self.closed: list[str] = []

    def _open(self, target: Address, by_address: Any, name: str | None, newer_than: int = -1) -> Landed[str]:
        dialled = self.resolve(target)
        sni = self.resolution.tls_name(target, dialled)  # what _dial hands TLS
        assert dialled == Address("ingress.example", 5671) and sni is not None
        self.sent.append(sni)
        self.opened += 1
        reached = self.misroutes.get(sni, by_address[target].name)
        return Landed(f"c{self.opened}", reached, dialled, f"c{self.opened}")

    def _close(self, connection: str) -> None:
        self.closed.append(connection)


def test_the_placer_sends_the_erlang_names_rule_and_lands_on_the_first_try() -> None:
    placer = IngressPlacer({})
    for short in ("rabbit-2", "rabbit-3", "rabbit-1"):
        landed = placer.place(short)
        assert landed.node == f"{short}@localhost" and landed.attempts == 1
    assert placer.sent == [f"rabbit-{i}.smartclient.test" for i in (2, 3, 1)] and placer.misrouted == 0
    assert placer.lb is None  # no load balancer: nothing is kept for another placement


def test_the_placer_closes_a_misrouted_connection_and_tries_the_next_candidate() -> None:
    placer = IngressPlacer({"rabbit-1.smartclient.test": "rabbit-3@localhost"})
    landed = placer.place()  # any node: rabbit-1's route reaches rabbit-3, so rabbit-2 it is
    assert landed.node == "rabbit-2@localhost" and landed.attempts == 2
    assert placer.closed == ["c1"] and placer.misrouted == 1
    placer = IngressPlacer({"rabbit-1.smartclient.test": "rabbit-3@localhost"})
    with pytest.raises(PlacementError, match="misrouted") as caught:
        placer.place("rabbit-1")
    cause = caught.value.__cause__
    assert isinstance(cause, Misrouted) and "'rabbit-1.smartclient.test' for node rabbit-1@localhost" in str(cause)
    assert "reached node rabbit-3@localhost" in str(cause)
    assert placer.misrouted == FAST.max_attempts == len(placer.closed)


def test_a_route_that_is_down_falls_through_to_the_next_candidate() -> None:
    class Down(IngressPlacer):
        def _open(self, target: Address, by_address: Any, name: str | None, newer_than: int = -1) -> Landed[str]:
            if by_address[target].name == "rabbit-1@localhost":
                self.opened += 1
                raise ConnectionFailed("connection refused")
            return super()._open(target, by_address, name, newer_than)

    placer = Down({})
    landed = placer.place()
    assert landed.node == "rabbit-2@localhost" and placer.opened == 2 and placer.misrouted == 0
