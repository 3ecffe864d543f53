"""The AMQP 1.0 data section a stream message's body travels in, by default.  Pure, no I/O.

Every client of a stream but smartclient's raw mode reads a message as an AMQP 1.0 message: the Java, Go and
.NET stream clients, rstream's ``AMQPMessage``, and the broker itself when it converts a stream's messages for an
AMQP 0.9.1 or 1.0 consumer (it closes an AMQP 0.9.1 consumer's connection on bytes that are not one).  The
smallest such message is one data section around the body::

    0x00 0x53 0x75   the data section's descriptor
    0xa0 <1 byte>    vbin8 and the body's length, for a body under 256 bytes, else
    0xb0 <4 bytes>   vbin32 and the body's length (big-endian)
    <the body>

5 or 8 bytes per message: exactly what rstream encodes for ``AMQPMessage(body=...)``.  The publish path packs
it with each entry's header (:mod:`smartclient.stream.publish_frames`); the consumer's split of a chunk strips it
(:mod:`smartclient.stream._rstream.frames`) from a message that is exactly one data section, so a consumer hands
over the body as it was sent.
"""

from __future__ import annotations

from smartclient._errors import ConfigurationError

__all__ = ["AMQP_SECTIONS", "DATA8", "DATA32", "ENCODINGS", "SHORT", "check_encoding", "data_section",
           "starts_amqp", "strip_data"]

#: a producer's ``encoding``: "amqp" (the default) or "raw" (the body alone, as smartclient wrote it before)
ENCODINGS = ("amqp", "raw")
#: the first 4 bytes of a data section, as one big-endian unsigned int: descriptor, then vbin8 / vbin32
DATA8, DATA32 = 0x005375A0, 0x005375B0
SHORT = 256  # a body shorter than this takes vbin8
_PREFIX8, _PREFIX32 = DATA8.to_bytes(4, "big"), DATA32.to_bytes(4, "big")
#: the section codes of an AMQP 1.0 message (header 0x70 ... footer 0x78), after the descriptor 0x00 0x53
AMQP_SECTIONS = range(0x70, 0x79)


def check_encoding(encoding: object, what: str) -> str:
    """``encoding`` if it is one of :data:`ENCODINGS`.

    :raises ConfigurationError: any other value, naming the option and ``what`` it was given for."""
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise ConfigurationError(f"encoding={encoding!r} for {what}: use 'amqp' (the default: an AMQP 1.0 message "
                                 f"every client reads) or 'raw' (the body alone: only stream clients read it)")
    return encoding


def data_section(body: bytes) -> bytes:
    """``body`` as an AMQP 1.0 message of one data section (the reference encoding; the publish path packs the
    same header with the entry's, in one ``struct`` call)."""
    size = len(body)
    if size < SHORT:
        return _PREFIX8 + bytes((size,)) + body
    return _PREFIX32 + size.to_bytes(4, "big") + body


def strip_data(message: bytes) -> bytes:
    """The body of ``message`` if it is exactly one AMQP 1.0 data section, else ``message`` itself (a raw
    message, or an AMQP 1.0 message with other sections: properties, annotations...)."""
    size = len(message)
    head = message[:4]
    if head == _PREFIX8:
        if size >= 5 and message[4] == size - 5:
            return message[5:]
    elif head == _PREFIX32 and size >= 8 and int.from_bytes(message[4:8], "big") == size - 8:
        return message[8:]
    return message


def starts_amqp(message: bytes) -> bool:
    """Whether ``message`` begins as an AMQP 1.0 message does: a described section (``0x00 0x53``, then a
    section code).  rstream's decoder does not always raise on other bytes: it is checked first."""
    return len(message) >= 3 and message[0] == 0 and message[1] == 0x53 and message[2] in AMQP_SECTIONS
