"""MQTT topic names and filters, and how RabbitMQ maps them to AMQP routing keys.  No I/O.

RabbitMQ's native MQTT publishes to a topic exchange (``amq.topic`` unless ``mqtt.exchange`` says
otherwise) with the routing key made from the MQTT topic by replacing ``/`` with ``.`` and ``+`` with
``*`` (``rabbit_mqtt_util:to_amqp/1``); ``#`` stays ``#``.  So a stream bound to ``amq.topic`` with
:func:`filter_to_binding_key` of an MQTT filter receives what an MQTT subscriber to that filter would.

A literal ``.`` or ``*`` inside a level does not survive the mapping (``v1.2/data`` becomes three AMQP
levels), so :func:`filter_to_binding_key` refuses filters whose levels carry them: the binding would
match other topics than the filter.
"""

from __future__ import annotations

from smartclient._errors import ConfigurationError
from smartclient.core.validation import text

__all__ = ["filter_to_binding_key", "topic_to_routing_key", "validate_filter", "validate_topic"]

_MAX = 65535


def _check_text(kind: str, value: str, option: str) -> None:
    text(option, value, note=f"an MQTT {kind}")
    if len(value.encode()) > _MAX:
        raise ConfigurationError(f"an MQTT {kind} is at most {_MAX} bytes, not {len(value.encode())}")
    if "\x00" in value:
        raise ConfigurationError(f"an MQTT {kind} may not contain NUL: {value!r}")


def validate_topic(topic: str) -> str:
    """A topic name to publish to: no wildcards.  :raises ConfigurationError: it is not one."""
    _check_text("topic name", topic, "topic")
    if "+" in topic or "#" in topic:
        raise ConfigurationError(f"cannot publish to topic {topic!r}: '+' and '#' are wildcards, for subscriptions "
                                 f"only")
    return topic


def validate_filter(topic_filter: str) -> str:
    """A topic filter to subscribe with: ``+`` fills a whole level, ``#`` only the whole last one.

    :raises ConfigurationError: it is not one."""
    _check_text("topic filter", topic_filter, "topic_filter")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ConfigurationError(f"bad MQTT topic filter {topic_filter!r}: '#' must be the whole last level")
        if "+" in level and level != "+":
            raise ConfigurationError(f"bad MQTT topic filter {topic_filter!r}: '+' must be a whole level")
    return topic_filter


def topic_to_routing_key(topic: str) -> str:
    """The AMQP routing key RabbitMQ gives a message published to MQTT topic ``topic``."""
    return validate_topic(topic).replace("/", ".")


def filter_to_binding_key(topic_filter: str) -> str:
    """The topic-exchange binding key that matches what MQTT filter ``topic_filter`` matches.

    :raises ConfigurationError: a bad filter, or one with ``.`` or ``*`` in a level (see the module doc).
    """
    validate_filter(topic_filter)
    for char in ".*":
        if char in topic_filter:
            raise ConfigurationError(
                f"the MQTT topic filter {topic_filter!r} contains {char!r}, which RabbitMQ does not escape when it "
                f"maps MQTT topics to routing keys: a binding for it would match other topics"
            )
    return topic_filter.replace("/", ".").replace("+", "*")
