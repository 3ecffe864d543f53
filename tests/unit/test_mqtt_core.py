"""MQTT's pure parts: topic mapping, options, failover order, identification by the newest listing,
fleet spread arithmetic, AMQP 1.0 decoding of what MQTT stores in a stream.  No broker."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import Address, ConfigurationError, MessageDecodeError
from smartclient.core.broker_nodes import evenly_spread, surplus
from smartclient.mqtt.fleet import FleetReport, MqttFleet
from smartclient.mqtt.placement import MqttOptions, MqttPlacer, mqtt_protocol
from smartclient.mqtt.topics import filter_to_binding_key, topic_to_routing_key, validate_filter, validate_topic
from smartclient.stream.codec import decode_amqp

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
    with pytest.raises(ConfigurationError, match="entry_points=, the management API, or a load balancer resolver with an MQTT listener"):
        MqttPlacer()


def test_failover_goes_round_the_entry_points() -> None:
    placer = MqttPlacer(entry_points=["mqtt://a:1883", "b:1884", Address("c", 1885)])
    assert [t for t, _ in placer.failover_targets()] == [Address("a", 1883), Address("b", 1884), Address("c", 1885)]
    assert placer.next_target(Address("b", 1884)) == (Address("c", 1885), None)
    assert placer.next_target(Address("c", 1885)) == (Address("a", 1883), None)
    assert placer.next_target(Address("elsewhere", 1)) == (Address("a", 1883), None)
    through = MqttPlacer(resolver=LoadBalancer("lb:5552", mqtt=1883))
    assert through.next_target(Address("anything", 1)) == (Address("lb", 1883), None)


class _Api:
    """A management API stand-in that lists given connection rows."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def get(self, path: str) -> list[dict[str, Any]]:
        assert path.startswith("/api/connections?columns=node,connected_at,client_properties.client_id")
        return self.rows


def _row(client_id: str, node: str, at: int) -> dict[str, Any]:
    return {"node": node, "connected_at": at, "client_properties": {"client_id": client_id}}


def test_identification_takes_the_newest_listing_and_skips_ones_seen_before() -> None:
    api = _Api([_row("d-1", "rabbit-1@h", 100), _row("d-1", "rabbit-2@h", 250), _row("d-2", "rabbit-3@h", 90)])
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
        MqttFleet(MqttPlacer(resolver=LoadBalancer("lb:5552", mqtt=1883)), 10)


def test_what_mqtt_stores_in_a_stream_decodes_to_payload_and_topic_key() -> None:
    assert decode_amqp(MQTT_IN_STREAM) == (b'{"i": 0}', "iot.dev-1.temp")
    with pytest.raises(MessageDecodeError, match=r"offset 3 of stream 's' is not an AMQP 1\.0 message") as caught:
        decode_amqp(b"plain bytes", stream="s", offset=3)
    assert (caught.value.stream, caught.value.offset) == ("s", 3)
