"""Which node an MQTT connection reached, by its QoS 0 subscription's queue (no broker: the client and the
management API are stand-ins; the integration tests read a real one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("paho.mqtt", reason="the [mqtt] extra is not installed")

from smartclient import ManagementError  # noqa: E402
from smartclient.management import ManagementClient  # noqa: E402
from smartclient.mqtt.options import MqttOptions  # noqa: E402
from smartclient.mqtt.whereabouts import ANSWER_WITHIN, subscribed_node  # noqa: E402


class Client:
    client_id = "dev/7"

    def __init__(self, granted: bool = True) -> None:
        self.granted = granted
        self.topics: list[tuple[str, float]] = []

    def while_subscribed(self, topic: str, timeout: float, read: Callable[[], Any]) -> Any:
        self.topics.append((topic, timeout))
        return read() if self.granted else None


def test_the_node_is_the_one_of_the_subscriptions_queue_read_without_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    api = ManagementClient("http://127.0.0.1:1", "guest", "guest")
    monkeypatch.setattr(api, "get", lambda path: asked.append(path) or {"node": "rabbit-2@n2"})
    client = Client()
    assert subscribed_node(api.queue_node, client, "/") == "rabbit-2@n2"
    assert asked == ["/api/queues/%2F/mqtt-subscription-dev%2F7qos0?columns=node&disable_stats=true"]
    (topic, timeout), = client.topics
    assert topic.startswith("smartclient/where/") and len(topic) > 30 and timeout == ANSWER_WITHIN


def test_nothing_is_said_when_the_subscription_is_not_granted_or_the_queue_not_shown() -> None:
    assert subscribed_node(lambda vhost, queue: "x", Client(granted=False), "/") is None

    def missing(vhost: str, queue: str) -> str | None:
        raise ManagementError("404 Object Not Found")

    assert subscribed_node(missing, Client(), "/") is None
    api = ManagementClient("http://127.0.0.1:1", "guest", "guest")
    api.get = lambda path: {"name": "no node"}  # type: ignore[method-assign]
    assert subscribed_node(api.queue_node, Client(), "v") is None


def test_only_a_session_that_ends_with_its_connection_is_asked() -> None:
    assert MqttOptions().session_ends_with_connection  # MQTT 5, a clean start, no expiry
    assert MqttOptions(protocol="3.1.1").session_ends_with_connection
    assert not MqttOptions(clean_start=False).session_ends_with_connection
    assert not MqttOptions(protocol="3.1.1", clean_start=False).session_ends_with_connection
    assert not MqttOptions(session_expiry=60).session_ends_with_connection
    assert MqttOptions(protocol="3.1.1", session_expiry=60).session_ends_with_connection  # (5 only)
