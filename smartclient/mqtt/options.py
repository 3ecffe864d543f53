"""How each MQTT connection is opened: :class:`MqttOptions`, a frozen value that checks itself, and the protocol
versions smartclient speaks (:func:`mqtt_protocol`)."""

from __future__ import annotations

from dataclasses import dataclass

from smartclient._errors import ConfigurationError
from smartclient.core.validation import flag, number, refuse, whole
from smartclient.mqtt._paho import MQTTProtocolVersion, Properties, session_properties

__all__ = ["MqttOptions", "mqtt_protocol"]


def mqtt_protocol(version: int | str) -> MQTTProtocolVersion:
    """``5``/``"5"``/``"5.0"`` -> MQTT 5; ``4``/``"3.1.1"``/``311`` -> MQTT 3.1.1.

    :raises ConfigurationError: any other version (3.1 is not supported by RabbitMQ's native MQTT)."""
    key = str(version).strip()
    if key in ("5", "5.0", "MQTTv5"):
        return MQTTProtocolVersion.MQTTv5
    if key in ("4", "3.1.1", "311", "MQTTv311"):
        return MQTTProtocolVersion.MQTTv311
    raise ConfigurationError(f"unsupported MQTT protocol version {version!r}: use 5 or '3.1.1'")


@dataclass(frozen=True)
class MqttOptions:
    """How each MQTT connection is opened.

    :param protocol: 5 or ``"3.1.1"``.
    :param keepalive: seconds between PINGREQs when idle (the broker drops the client after 1.5x).
    :param clean_start: False keeps the session (subscriptions, queued QoS 1 messages) across
        connections; with MQTT 5, ``session_expiry`` says for how long after a disconnect.
    :param session_expiry: MQTT 5 session expiry interval in seconds (None: 0 with a clean start,
        one day without).
    :param connect_timeout: seconds for the TCP/TLS connect and the CONNACK.
    :param reconnect_delay: (first, max) seconds between the failed attempts of one reconnect (a core
        :class:`~smartclient.core.retry.Backoff` doubling from the first, with the placer's
        ``RetryPolicy`` jitter); the first attempt goes at once.
    """

    protocol: int | str = 5
    keepalive: int = 60
    clean_start: bool = True
    session_expiry: int | None = None
    connect_timeout: float = 5.0
    reconnect_delay: tuple[float, float] = (0.1, 5.0)

    def __post_init__(self) -> None:
        mqtt_protocol(self.protocol)
        whole("MqttOptions.keepalive", self.keepalive, low=1, high=65535, note="seconds")
        flag("MqttOptions.clean_start", self.clean_start)
        whole("MqttOptions.session_expiry", self.session_expiry, low=0, high=0xFFFFFFFF, optional=True, note="seconds")
        number("MqttOptions.connect_timeout", self.connect_timeout, above=0, note="seconds")
        delay = self.reconnect_delay
        if not isinstance(delay, tuple | list) or len(delay) != 2:
            refuse("MqttOptions.reconnect_delay", "(first, max) seconds", delay)
        number("MqttOptions.reconnect_delay's first", delay[0], above=0, note="seconds")
        number("MqttOptions.reconnect_delay's max", delay[1], low=delay[0], note="seconds, at least the first")

    @property
    def version(self) -> MQTTProtocolVersion:
        return mqtt_protocol(self.protocol)

    @property
    def session_ends_with_connection(self) -> bool:
        """A clean start with no session expiry: what the connection subscribes to is its own, on its node."""
        return self.clean_start and (self.version is not MQTTProtocolVersion.MQTTv5 or not self.session_expiry)

    def connect_properties(self) -> Properties | None:
        if self.version is not MQTTProtocolVersion.MQTTv5:
            return None
        expiry = self.session_expiry if self.session_expiry is not None else (0 if self.clean_start else 86400)
        return session_properties(expiry)
