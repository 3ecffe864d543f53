"""Decoding stream messages that were stored as AMQP 1.0 (by MQTT and AMQP 0.9.1 publishers). No I/O.

RabbitMQ stores what MQTT devices and AMQP 0.9.1 clients publish to a stream as AMQP 1.0 messages
(header, message annotations with ``x-exchange`` and ``x-routing-key``, data sections).  rstream's
decoder reads them; :func:`decode_amqp` gives the two parts a reader usually wants.
"""

from __future__ import annotations

from smartclient._errors import ConfigurationError

__all__ = ["decode_amqp"]


def decode_amqp(raw: bytes, where: str = "a message") -> tuple[bytes, str | None]:
    """``(body, x-routing-key)`` of an AMQP 1.0 encoded message (rstream's decoder).

    :raises ConfigurationError: ``raw`` is not an AMQP 1.0 message."""
    from smartclient.stream._rstream import decode_amqp_message

    try:
        message = decode_amqp_message(raw)
    except Exception as exc:  # rstream raises TypeError/IndexError on bytes that are not AMQP 1.0
        raise ConfigurationError(
            f"{where} is not an AMQP 1.0 message ({type(exc).__name__}); read it with option decode=none"
        ) from exc
    body = message.body
    if isinstance(body, list):  # several data sections
        body = b"".join(bytes(b) for b in body)
    annotations = message.message_annotations or {}
    key = annotations.get(b"x-routing-key", annotations.get("x-routing-key"))
    if isinstance(key, bytes):
        key = key.decode()
    return (body if isinstance(body, bytes) else str(body).encode()), (None if key is None else str(key))
