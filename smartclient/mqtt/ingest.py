"""MQTT → stream ingestion: bind a stream to the exchange RabbitMQ's MQTT plugin publishes to.

A device publishing to MQTT topic ``plant/7/temp`` makes RabbitMQ route the message through the topic
exchange ``amq.topic`` (``mqtt.exchange``) with routing key ``plant.7.temp``.  A stream bound to that
exchange with the binding key of an MQTT filter (``plant/+/temp`` → ``plant.*.temp``, see
:mod:`smartclient.mqtt.topics`) stores every such message once, as an AMQP 1.0 message whose body is
the MQTT payload; the stream consumer and the Spark source read it like any other stream, from replicas.

QoS 1 publishes are confirmed (PUBACK) only once the stream has the message, so a device that retries
until PUBACK loses nothing; a retry after a lost PUBACK can store a message twice (MQTT's at-least-once),
which a payload carrying its own id lets the reader drop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import quote

from smartclient._errors import ConfigurationError, StreamNotFound
from smartclient.core.stream_arguments import validate_stream_name
from smartclient.core.validation import refuse, text
from smartclient.mqtt.topics import filter_to_binding_key
from smartclient.options import management

if TYPE_CHECKING:
    from smartclient.management import ManagementClient

__all__ = ["MQTT_EXCHANGE", "bind_mqtt_topics", "mqtt_bindings", "unbind_mqtt_topics"]

#: the exchange RabbitMQ's MQTT plugin publishes to unless ``mqtt.exchange`` is set
MQTT_EXCHANGE = "amq.topic"


def _path(vhost: str, exchange: str, stream: str) -> str:
    return f"/api/bindings/{quote(vhost, safe='')}/e/{quote(exchange, safe='')}/q/{quote(stream, safe='')}"


def _checked(api: object, stream: object, exchange: object, vhost: object, topic_filters: object = ()) -> list[str]:
    """Each argument checked, before any request; the topic filters as a list."""
    management("api", api, optional=False)
    validate_stream_name(stream)  # type: ignore[arg-type]
    text("exchange", exchange)
    text("vhost", vhost)
    if isinstance(topic_filters, str):
        return [topic_filters]
    if isinstance(topic_filters, bytes | dict) or not isinstance(topic_filters, Iterable):
        refuse("topic_filters", "an MQTT topic filter, or a list of them", topic_filters)
    filters = list(topic_filters)
    if not all(isinstance(f, str) for f in filters):
        refuse("topic_filters", "an MQTT topic filter, or a list of them", topic_filters)
    return filters


def _check_stream(api: ManagementClient, vhost: str, stream: str) -> None:
    from smartclient.management import ManagementError

    try:
        info = api.queue(vhost, stream)
    except ManagementError as exc:
        if exc.status == 404:
            raise StreamNotFound(
                f"no stream {stream!r} in vhost {vhost!r}: create it before binding MQTT topics"
            ) from exc
        raise
    if info.get("type") != "stream":
        raise ConfigurationError(f"{stream!r} is a {info.get('type')} queue, not a stream")


def mqtt_bindings(api: ManagementClient, stream: str, *, exchange: str = MQTT_EXCHANGE, vhost: str = "/") -> set[str]:
    """The binding keys from ``exchange`` to ``stream``."""
    _checked(api, stream, exchange, vhost)
    return {str(b["routing_key"]) for b in api.get(_path(vhost, exchange, stream))}


def bind_mqtt_topics(api: ManagementClient, stream: str, topic_filters: str | Iterable[str], *,
                     exchange: str = MQTT_EXCHANGE, vhost: str = "/") -> list[str]:
    """Bind ``stream`` to what MQTT clients publish under ``topic_filters``; return the binding keys.
    Binding again is a no-op.

    :raises ConfigurationError: a bad filter (or one RabbitMQ's mapping cannot express), or not a stream.
    :raises StreamNotFound: there is no such stream.
    """
    keys = [filter_to_binding_key(f) for f in _checked(api, stream, exchange, vhost, topic_filters)]
    if not keys:
        raise ConfigurationError("no MQTT topic filter given")
    _check_stream(api, vhost, stream)
    existing = mqtt_bindings(api, stream, exchange=exchange, vhost=vhost)
    for key in keys:
        if key not in existing:
            api.post(_path(vhost, exchange, stream), {"routing_key": key})
    return keys


def unbind_mqtt_topics(api: ManagementClient, stream: str, topic_filters: str | Iterable[str], *,
                       exchange: str = MQTT_EXCHANGE, vhost: str = "/") -> None:
    """Remove the bindings :func:`bind_mqtt_topics` made (missing ones are ignored)."""
    keys = [filter_to_binding_key(f) for f in _checked(api, stream, exchange, vhost, topic_filters)]
    existing = {str(b["routing_key"]): str(b["properties_key"]) for b in api.get(_path(vhost, exchange, stream))}
    for key in keys:
        if key in existing:
            api.delete(f"{_path(vhost, exchange, stream)}/{quote(existing[key], safe='')}")
