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


def api_of(rows: dict[str, tuple[list[str], str | None]], asked: list[str]) -> ManagementClient:
    """A management client of nodes ``rows``: base URL -> (the routing keys its view binds the queue with, the
    node its row names), answered by a mock transport; each request's URL goes to ``asked``."""
    import httpx

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        keys, node = rows[base]
        if request.url.path.endswith("/bindings"):
            return httpx.Response(200, json=[{"routing_key": "mqtt-subscription-x"}, *(
                {"routing_key": key} for key in keys)])
        return httpx.Response(200, json={"node": node} if node else {"name": "no node"})

    api = ManagementClient(list(rows), "guest", "guest")
    api._client = httpx.Client(transport=httpx.MockTransport(answer))
    return api


def test_the_node_is_the_one_of_the_subscriptions_queue_read_without_statistics_and_bound_to_its_topic() -> None:
    asked: list[str] = []
    client = Client()
    api = api_of({"http://n1:1": (["any"], "rabbit-1@n1"), "http://n2:1": (["any"], "rabbit-2@n2")}, asked)
    original = api.queue_node_bound

    def bound(vhost: str, queue: str, key: str) -> str | None:  # the topic's binding key, shown by n2 alone
        api._client = api_of({"http://n1:1": ([], "rabbit-1@n1"), "http://n2:1": ([key], "rabbit-2@n2")},
                             asked)._client
        return original(vhost, queue, key)

    assert subscribed_node(bound, client, "/") == "rabbit-2@n2"
    (topic, timeout), = client.topics
    assert topic.startswith("smartclient/where/") and len(topic) > 30 and timeout == ANSWER_WITHIN
    queue = "/api/queues/%2F/mqtt-subscription-dev%2F7qos0"
    assert asked == [f"http://n1:1{queue}/bindings", f"http://n2:1{queue}/bindings",
                     f"http://n2:1{queue}?columns=node&disable_stats=true"]
    assert api.base_url == "http://n2:1"  # asked first from then on


def test_a_management_node_that_does_not_show_the_new_binding_is_not_believed() -> None:
    """A node in a partition's minority still shows the queue an earlier connection of the client id left, on its
    node: without the binding just made, its answer is not taken; no node showing it says nothing."""
    asked: list[str] = []
    api = api_of({"http://n1:1": (["smartclient.where.old"], "rabbit-1@n1"), "http://n2:1": ([], "rabbit-2@n2")},
                 asked)
    assert api.queue_node_bound("/", "q", "smartclient.where.new") is None
    assert api.base_url == "http://n1:1"
    assert api_of({"http://n1:1": (["k"], None)}, asked).queue_node_bound("/", "q", "k") is None  # no node named


def test_nothing_is_said_when_the_subscription_is_not_granted_or_the_queue_not_shown() -> None:
    assert subscribed_node(lambda vhost, queue, key: "x", Client(granted=False), "/") is None

    def missing(vhost: str, queue: str, key: str) -> str | None:
        raise ManagementError("404 Object Not Found")

    assert subscribed_node(missing, Client(), "/") is None


def test_only_a_session_that_ends_with_its_connection_is_asked() -> None:
    assert MqttOptions().session_ends_with_connection  # MQTT 5, a clean start, no expiry
    assert MqttOptions(protocol="3.1.1").session_ends_with_connection
    assert not MqttOptions(clean_start=False).session_ends_with_connection
    assert not MqttOptions(protocol="3.1.1", clean_start=False).session_ends_with_connection
    assert not MqttOptions(session_expiry=60).session_ends_with_connection
    assert MqttOptions(protocol="3.1.1", session_expiry=60).session_ends_with_connection  # (5 only)
