"""MQTT's pure parts: topic mapping, options, reconnect and fleet candidates (and a reconnect driven
through the core's placement loop over a fake network), identification by the newest listing,
fleet spread arithmetic, AMQP 1.0 decoding of what MQTT stores in a stream.  No broker."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import (
    Address,
    ClientSettings,
    ConfigurationError,
    ConnectionFailed,
    HandleClosed,
    MessageDecodeError,
    NodeUnreachable,
    NodeUntold,
    PlacementError,
    RetryPolicy,
)
from smartclient.core.broker_nodes import (
    evenly_spread,
    rebalance,
    reconnect_candidates,
    rotated,
    spread_candidates,
    surplus,
)
from smartclient.mqtt.fleet import FleetReport, MqttFleet
from smartclient.mqtt.placed import UNTOLD_AFTER
from smartclient.mqtt.placement import MqttOptions, MqttPlacer, mqtt_protocol
from smartclient.mqtt.topics import filter_to_binding_key, topic_to_routing_key, validate_filter, validate_topic
from smartclient.stream.codec import decode_amqp
from tests.conftest import wait_until_sync
from tests.unit.fakes import QUICK_RECONNECT, FakeManagement, FakeMqttClient, direct_network

# what RabbitMQ 4.0.5 stored in a stream for an MQTT QoS 1 publish to iot/dev-1/temp (captured)
MQTT_IN_STREAM = (b'\x00Sp\xc0\x06\x05A@@AC\x00Sr\xc17\x04\xa3\nx-exchange\xa1\tamq.topic\xa3\rx-routing-key'
                  b'\xa1\x0eiot.dev-1.temp\x00Su\xa0\x08{"i": 0}')


@pytest.mark.parametrize(("topic", "key"), [
    ("a", "a"), ("a/b/c", "a.b.c"), ("sensors/device1/temp", "sensors.device1.temp"), ("a//c", "a..c"),
    ("/a", ".a"),
])
def test_topics_map_to_routing_keys_as_rabbitmq_does(topic: str, key: str) -> None:
    assert topic_to_routing_key(topic) == key


@pytest.mark.parametrize(("topic_filter", "key"), [
    ("iot/+/temp", "iot.*.temp"), ("iot/#", "iot.#"), ("#", "#"), ("+", "*"), ("a/b", "a.b"),
])
def test_filters_map_to_binding_keys(topic_filter: str, key: str) -> None:
    assert filter_to_binding_key(topic_filter) == key


@pytest.mark.parametrize(("bad", "message"), [
    ("a/#/b", "'#' must be the whole last level"), ("a/b#", "'#' must be the whole last level"),
    ("a/b+/c", "'\\+' must be a whole level"), ("", "non-empty"), ("a\x00b", "NUL"),
])
def test_bad_filters_are_refused(bad: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        validate_filter(bad)


def test_filters_whose_dots_rabbitmq_would_not_escape_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="would match other topics"):
        filter_to_binding_key("fw/v1.2/+")
    with pytest.raises(ConfigurationError, match="would match other topics"):
        filter_to_binding_key("a/*/b")


def test_wildcards_cannot_be_published_to() -> None:
    with pytest.raises(ConfigurationError, match="wildcards"):
        validate_topic("iot/+/temp")
    assert validate_topic("iot/7/temp") == "iot/7/temp"


def test_protocol_versions_and_options_are_checked_before_any_io() -> None:
    assert mqtt_protocol(5).name == "MQTTv5" and mqtt_protocol("3.1.1").name == "MQTTv311"
    with pytest.raises(ConfigurationError, match="unsupported MQTT protocol version"):
        mqtt_protocol("3.1")
    with pytest.raises(ConfigurationError, match="keepalive"):
        MqttOptions(keepalive=0)
    with pytest.raises(ConfigurationError, match="session_expiry"):
        MqttOptions(session_expiry=-1)
    with pytest.raises(ConfigurationError, match="reconnect_delay"):
        MqttOptions(reconnect_delay=(2.0, 1.0))
    v5 = MqttOptions(clean_start=False).connect_properties()
    assert v5 is not None and v5.SessionExpiryInterval == 86400  # a kept session outlives a disconnect
    assert MqttOptions(protocol="3.1.1").connect_properties() is None


def test_a_placer_needs_a_way_to_find_nodes() -> None:
    with pytest.raises(ConfigurationError,
                       match="entry_points=, the management API, or a load balancer resolver with an MQTT listener"):
        MqttPlacer()


def test_what_a_placer_aims_at_is_every_node_or_the_entry_points() -> None:
    placer = MqttPlacer(entry_points=["mqtt://a:1883", "b:1884", Address("c", 1885)])
    assert placer.targets() == {Address("a", 1883): None, Address("b", 1884): None, Address("c", 1885): None}


# -- the pure decisions (smartclient.core.broker_nodes) ----------------------------------------------
A, B, C = (Address(f"n{i}", 1883) for i in (1, 2, 3))


def test_a_reconnect_moves_on_and_comes_back_last() -> None:
    assert reconnect_candidates((A, B, C), B).tiers == ((C, A), (B,))
    assert reconnect_candidates((A, B, C), C).tiers == ((A, B), (C,))
    assert reconnect_candidates((A, B, C), Address("gone", 1)).tiers == ((A, B, C),)  # any node
    assert reconnect_candidates((A,), A).tiers == ((A,),)
    with pytest.raises(ConfigurationError, match="no node"):
        reconnect_candidates((), A)


def test_each_fleet_client_gets_its_node_then_the_others_or_any_through_a_balancer() -> None:
    assert spread_candidates(0, (A, B, C), through_lb=False).tiers == ((A,), (B, C))
    assert spread_candidates(4, (A, B, C), through_lb=False).tiers == ((B,), (C, A))
    assert spread_candidates(4, (A, B, C), through_lb=True).tiers == ((A, B, C),)
    assert [spread_candidates(i, (A, B, C), through_lb=False).tiers[0][0] for i in range(6)] == [A, B, C] * 2
    assert rotated("abc", 4) == ("b", "c", "a") and rotated((), 3) == ()


def test_a_rebalance_moves_the_surplus_to_the_nodes_below_their_share() -> None:
    landed = [(0, "a"), (1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, None)]
    assert rebalance(landed, ["a", "b", "c"], 6) == ([2, 3, 5], ("b", "c"))
    assert rebalance([(0, "a"), (1, "b")], ["a", "b"], 2) == ([], ("a", "b"))  # even: no room, any node


# -- a reconnect driven through the core's placement loop, with a fake network (tests/unit/fakes.py) ---------
class _LbPlacer(MqttPlacer):
    """Through a load balancer, the node a connection reached as the management API would list it."""

    def _identify(self, connection: Any, name: str, newer_than: int,
                  untold_after: float | None = None) -> tuple[str, int]:
        assert connection.reached is not None
        return f"rabbit@{connection.reached.host}", newer_than + 1


FAST = RetryPolicy(backoff_initial=0.0, backoff_max=0.0, sticky_window=4, max_time=5.0)


def test_a_direct_reconnect_goes_to_the_next_node_that_answers() -> None:
    placer = MqttPlacer(settings=ClientSettings(retry=FAST), entry_points=["n1:1883", "n2:1883", "n3:1883"],
                        options=QUICK_RECONNECT)
    client = FakeMqttClient(direct_network({C}), B)
    placer.reconnect(client)  # type: ignore[arg-type]
    assert [d for _, d in client.dials] == [C, A]  # the next node first, then the one after
    assert (client.target, client.dialled, client.failovers, client.attempts) == (A, A, 1, 2)


def test_a_direct_reconnect_goes_back_to_its_node_only_when_no_other_answers() -> None:
    placer = MqttPlacer(settings=ClientSettings(retry=FAST), entry_points=["n1:1883", "n2:1883", "n3:1883"],
                        options=QUICK_RECONNECT)
    client = FakeMqttClient(direct_network({A, C}), B)
    placer.reconnect(client)  # type: ignore[arg-type]
    assert [d for _, d in client.dials] == [C, A, B] and client.target == B


def test_a_disconnect_by_the_application_stops_a_reconnect_under_way() -> None:
    placer = MqttPlacer(settings=ClientSettings(retry=replace(FAST, max_attempts=50)),
                        entry_points=["n1:1883", "n2:1883"], options=QUICK_RECONNECT)
    client = FakeMqttClient(direct_network({A, B}), A)

    def refused_then_disconnected(dialled: Address) -> Address:
        client.disconnect_asked = True  # the application's disconnect(), from its own thread, meanwhile
        raise ConnectionFailed(f"{dialled} refused")

    client.network = refused_then_disconnected
    with pytest.raises(HandleClosed, match="disconnected by the application during its reconnect"):
        placer.reconnect(client)  # type: ignore[arg-type]
    assert len(client.dials) == 1


def test_a_reconnect_that_reaches_nothing_gives_up_typed_after_the_policys_caps() -> None:
    placer = MqttPlacer(settings=ClientSettings(retry=replace(FAST, max_attempts=5)),
                        entry_points=["n1:1883", "n2:1883"], options=QUICK_RECONNECT)
    client = FakeMqttClient(direct_network({A, B}), A)
    with pytest.raises(PlacementError, match="within 5 attempts") as caught:
        placer.reconnect(client)  # type: ignore[arg-type]
    assert isinstance(caught.value.__cause__, ConnectionFailed) and len(client.dials) == 5


def mqtt_lb_placer() -> _LbPlacer:
    return _LbPlacer(FakeManagement(mqtt_nodes=(A, B, C)),  # type: ignore[arg-type]
                     settings=ClientSettings(resolver=LoadBalancer("lb:5552", mqtt=1883), retry=FAST),
                     options=QUICK_RECONNECT)


def test_a_reconnect_through_a_balancer_is_checked_and_a_miss_dropped() -> None:
    reached = iter([B, B, C])  # the balancer sends it back to its node twice, then elsewhere
    client = FakeMqttClient(lambda dialled: next(reached), B)
    placer = mqtt_lb_placer()
    placer.reconnect(client)  # type: ignore[arg-type]
    assert {d for _, d in client.dials} == {Address("lb", 1883)} and len(client.dials) == 3
    assert (client.node, client.target, client.attempts, client.listed_at) == ("rabbit@n3", C, 3, 4)


def test_a_reconnect_through_a_sticky_balancer_keeps_its_own_node_as_the_fallback() -> None:
    client = FakeMqttClient(lambda dialled: B, B)  # the balancer always sends it back where it was, and it is up
    mqtt_lb_placer().reconnect(client)  # type: ignore[arg-type]
    assert client.node == "rabbit@n2" and client.is_connected() and client.attempts == 5  # the core's window


def test_a_reconnect_through_a_balancer_that_never_reaches_a_cluster_node_is_node_unreachable() -> None:
    client = FakeMqttClient(lambda dialled: Address("elsewhere", 1883), B)
    with pytest.raises(NodeUnreachable, match="never routes to a candidate"):
        mqtt_lb_placer().reconnect(client)  # type: ignore[arg-type]


def test_a_reconnect_through_a_balancer_keeps_a_connection_whose_node_the_api_does_not_tell_in_time() -> None:
    """A partition: the management API's listing waits for a node cut off.  Any node will do for a reconnect, so the
    first connection made is kept at once, its node unknown, rather than dropped after each unanswered listing."""
    api = FakeManagement(mqtt_nodes=(A, B, C), unanswered=True)
    placer = MqttPlacer(api, settings=ClientSettings(resolver=LoadBalancer("lb:5552", mqtt=1883),  # type: ignore[arg-type]
                                                     retry=FAST),
                        options=replace(QUICK_RECONNECT, clean_start=False))  # (a persistent session: the listing)
    client = FakeMqttClient(lambda dialled: C, B)
    placer.reconnect(client)  # type: ignore[arg-type]
    assert len(client.dials) == 1 and client.is_connected() and client.attempts == 1
    assert client.node is None and client.dialled == Address("lb", 1883) and client.home is None
    assert api.asked_within == [UNTOLD_AFTER]  # bounded; the first placement's listing (None) waits as before
    placer.reconnect(client)  # type: ignore[arg-type]
    assert api.asked_within == [UNTOLD_AFTER] and client.is_connected()  # not asked again for UNTOLD_FOR s
    with pytest.raises(NodeUntold, match="did not answer which node"):
        placer._listing("dev-1", None, -1, untold_after=0.5)


def test_a_reconnect_after_a_connection_that_died_keeps_the_first_landing_and_learns_its_node_later() -> None:
    """Through a load balancer, after a connection that went silent or closed (not the PUBACK watch), the first
    connection that answers is kept at once; its node is read from the listing afterwards, on another thread."""
    api = FakeManagement([_row("dev-1", "rabbit@n2", 500)], mqtt_nodes=(A, B, C))
    placer = MqttPlacer(api, settings=ClientSettings(resolver=LoadBalancer("lb:5552", mqtt=1883),  # type: ignore[arg-type]
                                                     retry=FAST),
                        options=replace(QUICK_RECONNECT, clean_start=False))
    client = FakeMqttClient(lambda dialled: B, B)  # back on the node it had: it answers, so it will do
    client.lost_cut_off = False
    placer.reconnect(client)  # type: ignore[arg-type]
    assert len(client.dials) == 1 and client.attempts == 1 and client.is_connected()
    wait_until_sync(lambda: client.node == "rabbit@n2", 5, "the node learnt later")
    assert client.listed_at == 500 and client.home == B


def _row(client_id: str, node: str, at: int) -> dict[str, Any]:
    return {"node": node, "connected_at": at, "client_properties": {"client_id": client_id}}


def test_identification_takes_the_newest_listing_and_skips_ones_seen_before() -> None:
    api = FakeManagement([_row("d-1", "rabbit-1@h", 100), _row("d-1", "rabbit-2@h", 250),
                          _row("d-2", "rabbit-3@h", 90)])
    placer = MqttPlacer(api, entry_points=["x:1"])  # type: ignore[arg-type]
    assert placer.listings(["d-1", "d-2", "d-3"]) == {"d-1": ("rabbit-2@h", 250), "d-2": ("rabbit-3@h", 90)}
    # d-1 was last seen at 250: a connection being replaced must not pass for its successor
    assert placer.listings(["d-1"], {"d-1": 250}) == {}
    assert placer.nodes_of(["d-2"]) == {"d-2": "rabbit-3@h"}


def test_fleet_spread_arithmetic() -> None:
    nodes = ["a", "b", "c"]
    assert evenly_spread(Counter(a=334, b=333, c=333), nodes, 1000, 1.05)
    assert not evenly_spread(Counter(a=346, b=375, c=279), nodes, 1000, 1.05)
    assert not evenly_spread(Counter(a=500, b=500), nodes, 1000, 1.05)  # a node with none
    assert not evenly_spread(Counter(a=300, b=300, c=300), nodes, 1000, 1.05)  # not all identified yet
    landed = [(0, "a"), (1, "a"), (2, "a"), (3, "b"), (4, "x"), (5, None), (6, "a")]
    assert surplus(landed, nodes, 6) == [2, 4, 5, 6]  # share 2 per node; unknown nodes move too
    report = FleetReport(1000, 1000, {"a": 339, "b": 324, "c": 337}, 1.0, 5000.0)
    assert report.spread == pytest.approx(339 / 324)


def test_fleet_input_is_checked_before_any_io() -> None:
    placer = MqttPlacer(entry_points=["x:1"])
    with pytest.raises(ConfigurationError, match="size must be a positive int"):
        MqttFleet(placer, 0)
    with pytest.raises(ConfigurationError, match="tolerance"):
        MqttFleet(placer, 10, tolerance=0.9)
    with pytest.raises(ConfigurationError, match="needs the management API"):
        MqttFleet(MqttPlacer(settings=ClientSettings(resolver=LoadBalancer("lb:5552", mqtt=1883))), 10)


def test_what_mqtt_stores_in_a_stream_decodes_to_payload_and_topic_key() -> None:
    assert decode_amqp(MQTT_IN_STREAM) == (b'{"i": 0}', "iot.dev-1.temp")
    with pytest.raises(MessageDecodeError, match=r"offset 3 of stream 's' is not an AMQP 1\.0 message") as caught:
        decode_amqp(b"plain bytes", stream="s", offset=3)
    assert (caught.value.stream, caught.value.offset) == ("s", 3)


def test_a_hand_over_through_a_balancer_that_never_reaches_its_node_keeps_the_connection_it_holds() -> None:
    # its own node B is tier 0 of a hand-over; the balancer sends it to C and A by turns: both tier 1, and the
    # client (one connection per client id) holds only the latest, which is what it must keep (issue 53)
    reached = itertools.cycle([C, A])
    client = FakeMqttClient(lambda dialled: next(reached), B)
    client.home = B
    placer = mqtt_lb_placer()
    placer.reconnect(client, handover=True)  # type: ignore[arg-type]
    assert client.is_connected() and client.node == f"rabbit@{client.reached.host}"  # type: ignore[union-attr]
    assert client.attempts == 6  # the core's sticky window (4) past the two new nodes
    # the next hand-over aims at its own node again, not where it was kept; a reconnect (a failover) moves it
    assert client.reached != B and client.home == B
    reached = itertools.cycle([B])
    placer.reconnect(client, handover=True)  # type: ignore[arg-type]
    assert client.reached == B and client.attempts == 1 and client.home == B
    reached = itertools.cycle([C])
    placer.reconnect(client)  # type: ignore[arg-type]
    assert client.home == C
