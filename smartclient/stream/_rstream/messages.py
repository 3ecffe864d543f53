"""The seam to rstream, message side: the AMQP 1.0 messages rstream encodes and decodes."""

from __future__ import annotations

import struct
from typing import Any

from rstream import AMQPMessage, amqp_decoder

from smartclient._errors import MessageDecodeError
from smartclient.core.amqp_data import starts_amqp

__all__ = ["amqp_message", "body_of", "decode_amqp_message", "is_amqp_message"]


def amqp_message(body: bytes, application_properties: dict[str, Any] | None) -> Any:
    """An AMQP 1.0 message rstream encodes (application properties carried)."""
    return AMQPMessage(body=body, application_properties=application_properties)


def is_amqp_message(value: Any) -> bool:
    return isinstance(value, AMQPMessage)


def decode_amqp_message(raw: bytes, where: str = "the message", stream: str = "", offset: int | None = None) -> Any:
    """rstream's ``AMQPMessage`` decoded from ``raw``, an AMQP 1.0 message as stored.

    :raises MessageDecodeError: ``raw`` does not begin as an AMQP 1.0 message (a described section), or
        rstream's decoder fails on it (its IndexError, TypeError... is the cause); it carries ``stream`` and
        ``offset``, and its message begins with ``where``."""
    if not starts_amqp(raw):
        begins = f"it begins {bytes(raw[:8]).hex(' ')!r}" if raw else "it is empty"
        raise MessageDecodeError(f"{where} is not an AMQP 1.0 message ({begins}, not with a section: written with "
                                 f"encoding='raw'?)", stream, offset)
    try:
        return amqp_decoder(raw)
    except (IndexError, TypeError, ValueError, KeyError, OverflowError, struct.error) as exc:
        raise MessageDecodeError(f"{where} is not a valid AMQP 1.0 message ({type(exc).__name__}: {exc})", stream,
                                 offset) from exc


def body_of(message: Any) -> bytes:
    """The body of a decoded AMQP 1.0 message (rstream's ``AMQPMessage``): its data sections' bytes, joined when
    there are several, or an AMQP value's text."""
    body = message.body
    if isinstance(body, list):  # several data sections
        body = b"".join(bytes(b) for b in body)
    return body if isinstance(body, bytes) else str(body).encode()
