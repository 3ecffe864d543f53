"""AMQP 1.0 stream messages: decoding those stored by MQTT and AMQP 0.9.1 publishers, and building one with
application properties. No I/O.

RabbitMQ stores what MQTT devices and AMQP 0.9.1 clients publish to a stream as AMQP 1.0 messages
(header, message annotations with ``x-exchange`` and ``x-routing-key``, data sections).  rstream's
decoder reads them; :func:`decode_amqp` gives the two parts a reader usually wants.  A consumer hands over a
message that is exactly one data section (what smartclient's producers write by default) as its body: decode
``chunk.stored`` (the messages as stored), not ``chunk.bodies``, to read those too.  :func:`amqp_message` builds
a message that carries application properties, for a producer to send as it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["amqp_message", "decode_amqp"]


def amqp_message(body: bytes, application_properties: dict[str, Any] | None = None) -> Any:
    """An AMQP 1.0 message of ``body`` with ``application_properties`` (rstream's ``AMQPMessage``), which a
    producer's ``send`` writes as it encodes itself.  Needs the ``[stream]`` extra."""
    from smartclient.stream._rstream import amqp_message as build

    return build(body, application_properties)


def decode_amqp(raw: bytes, where: str | None = None, *, stream: str = "", offset: int | None = None
                ) -> tuple[bytes, str | None]:
    """``(body, x-routing-key)`` of an AMQP 1.0 encoded message (rstream's decoder).

    :param where: how the error names the message (default: by ``offset`` and ``stream``, if given).
    :raises MessageDecodeError: ``raw`` is not an AMQP 1.0 message (for example a message a producer wrote with
        ``encoding="raw"``); it carries ``stream`` and ``offset``."""
    from smartclient.stream._rstream import body_of, decode_amqp_message

    if where is None:
        where = "the message" if offset is None else f"the message at offset {offset} of stream {stream!r}"
    message = decode_amqp_message(raw, where, stream, offset)
    annotations = message.message_annotations or {}
    key = annotations.get(b"x-routing-key", annotations.get("x-routing-key"))
    if isinstance(key, bytes):
        key = key.decode()
    return body_of(message), (None if key is None else str(key))

