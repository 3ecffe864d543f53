"""AMQP 1.0 on the wire by default (issue 29, item 3): a producer's Publish frames, byte for byte rstream's
encoding of ``AMQPMessage(body=...)``; the consumer's split handing the body back (and the messages as stored for
decoding); a raw message decoded raising a typed error that names its offset.  No broker."""

from __future__ import annotations

import asyncio
import pickle
import random
import struct

import pytest
from rstream import AMQPMessage, amqp_decoder, schema
from rstream.encoding import decode_frame, encode_frame, encode_publish

from smartclient import BatchingPolicy, ConfigurationError, MessageDecodeError, MessageTooLarge
from smartclient.core.amqp_data import check_encoding, data_section, starts_amqp, strip_data
from smartclient.core.delivery import Chunk
from smartclient.stream._rstream.columns import chunk_of
from smartclient.stream._rstream.frames import decode_hot, messages_of, stored_of
from smartclient.stream._rstream.messages import decode_amqp_message
from smartclient.stream.codec import decode_amqp
from smartclient.stream.publish_frames import sub_entry
from smartclient.stream.publishing import NOT_QUEUED, QUEUED, PublishBuffer
from tests.unit.fakes import FakeClient, deliver, simple

SHORT, EDGE, LONG = b"m" * 100, b"e" * 255, b"L" * 256  # vbin8, the longest vbin8, the shortest vbin32


def amqp(body: bytes) -> bytes:
    """rstream's encoding of ``AMQPMessage(body=body)``; for an empty body, the data section it should write
    (rstream writes no section at all: an empty message, which no AMQP 1.0 reader takes)."""
    return bytes(AMQPMessage(body=body)) if body else b"\x00Su\xa0\x00"


def rstreams(publisher: int, messages: list[tuple[int, bytes]], version: int = 1,
             values: dict[int, str] | None = None) -> bytes:
    """rstream's Publish frame of ``messages``, each ``(publishing id, message as stored)``."""
    return encode_publish(schema.Publish(publisher_id=publisher, messages=[
        schema.Message(publishing_id=pid, filter_value=(values or {}).get(pid), data=data)
        for pid, data in messages]), version)


# -- the data section ---------------------------------------------------------------------------------------
def test_the_data_section_is_rstreams_amqpmessage_and_strips_back_to_the_body() -> None:
    for body in (b"", b"x", SHORT, EDGE, LONG, b"y" * 70_000):
        assert data_section(body) == amqp(body) and strip_data(amqp(body)) == body
        assert amqp_decoder(data_section(body)).body == body
    assert bytes(AMQPMessage(body=b"")) == b""  # rstream's quirk (see amqp())
    assert data_section(b"ab")[:5] == bytes([0x00, 0x53, 0x75, 0xA0, 2])
    assert data_section(LONG)[:8] == bytes([0x00, 0x53, 0x75, 0xB0, 0, 0, 1, 0])
    with_properties = bytes(AMQPMessage(body=b"abc", application_properties={"k": "v"}))
    for whole in (b"raw-1", b"", b"\x00Su", b"\x00Su\xa0", b"\x00Su\xa0\x05abc", amqp(b"abc") + b"\x00",
                  b"\x00Su\xb0\x00\x00\x00\x09abc", with_properties):
        assert strip_data(whole) == whole  # not exactly one data section: handed over whole
    assert starts_amqp(amqp(b"")) and starts_amqp(with_properties) and not starts_amqp(b"raw-1")
    assert not starts_amqp(b"\x00S") and not starts_amqp(b"\x00S\x79")


def test_an_encoding_is_amqp_or_raw_and_anything_else_names_the_option() -> None:
    assert check_encoding("amqp", "p") == "amqp" and check_encoding("raw", "p") == "raw"
    for bad in ("json", "AMQP", "", None, 1, b"raw"):
        with pytest.raises(ConfigurationError, match=r"encoding=.* for a producer on 's'"):
            check_encoding(bad, "a producer on 's'")


def test_a_bad_encoding_fails_before_any_io() -> None:
    from smartclient import Environment

    async def scenario() -> None:
        env = Environment("rabbitmq-stream://guest:guest@127.0.0.1:1/")  # nothing listens there: no I/O at all
        with pytest.raises(ConfigurationError, match="encoding='json'"):
            await env.producer("s", encoding="json")
        with pytest.raises(ConfigurationError, match="encoding='xml' for ProducerOptions"):
            await env.super_stream_producer("ss", encoding="xml")

    asyncio.run(scenario())


# -- the publish path -----------------------------------------------------------------------------------------
def test_every_publish_path_writes_rstreams_amqp_encoding_of_each_body() -> None:
    """put(), add() with bytearray, add_many() with short, long and mixed bodies and a memoryview, an
    AMQPMessage with application properties (written as it encodes itself), resume(): byte for byte the frames
    rstream writes for AMQPMessage(body=...)."""
    carried = AMQPMessage(body=b"with-properties", application_properties={"colour": "blue", "n": 3})

    async def scenario() -> None:
        client = FakeClient()
        buffer = PublishBuffer(client, 4, "s", BatchingPolicy(batch_size=4, linger=5))
        assert buffer.encoding == "amqp"
        assert [buffer.put(pid, body, None) for pid, body in ((1, SHORT), (2, LONG))] == [QUEUED, QUEUED]
        await buffer.add(3, bytearray(EDGE))
        await buffer.add(4, carried)
        await buffer.add_many(5, [b"a"] * 4)  # all short: the C path
        await buffer.add_many(9, [LONG] * 4)  # all long: the C path
        await buffer.add_many(13, [SHORT, LONG, memoryview(b"mv"), b""])  # mixed, and not only bytes
        buffer._flush()
        expected = [
            rstreams(4, [(1, amqp(SHORT)), (2, amqp(LONG)), (3, amqp(EDGE)), (4, bytes(carried))]),
            rstreams(4, [(5 + i, amqp(b"a")) for i in range(4)]),
            rstreams(4, [(9 + i, amqp(LONG)) for i in range(4)]),
            rstreams(4, [(13, amqp(SHORT)), (14, amqp(LONG)), (15, amqp(b"mv")), (16, amqp(b""))]),
        ]
        assert client.frames == expected
        assert [amqp_decoder(bytes(carried)).application_properties] == [{b"colour": b"blue", b"n": 3}]
        buffer.suspend()
        client.frames.clear()
        assert buffer.resume(client, 4) == 16 and client.frames == expected  # the same frames, again

        raw_client = FakeClient()
        raw = PublishBuffer(raw_client, 1, "s", BatchingPolicy(batch_size=3, linger=5), encoding="raw")
        raw.put(1, SHORT, None)
        await raw.add(2, carried)
        await raw.add_many(3, [LONG])
        assert raw_client.frames == [rstreams(1, [(1, SHORT), (2, bytes(carried)), (3, LONG)])]

    asyncio.run(scenario())


def test_a_filter_values_frames_carry_the_data_section_too() -> None:
    async def scenario() -> None:
        client = FakeClient()
        buffer = PublishBuffer(client, 2, "s", BatchingPolicy(batch_size=3, linger=5),
                               filter_value=lambda body: "v")
        await buffer.add(1, b"x1")
        await buffer.add_many(2, [LONG, AMQPMessage(body=b"m", application_properties={"a": 1})])
        assert client.frames == [rstreams(2, [(1, amqp(b"x1")), (2, amqp(LONG)),
                                              (3, bytes(AMQPMessage(body=b"m", application_properties={"a": 1})))],
                                          2, {1: "v", 2: "v", 3: "v"})]

    asyncio.run(scenario())


def test_the_frame_size_counts_the_data_section() -> None:
    """13 bytes of frame header, then 17 per short message (12 + 5) or 20 per long one (12 + 8)."""
    async def scenario() -> None:
        client = FakeClient()
        client._frame_max = 13 + 3 * (300 + 20)  # three 300-byte messages to a frame, exactly
        buffer = PublishBuffer(client, 1, "s", BatchingPolicy(batch_size=100, linger=5))
        await buffer.add_many(1, [b"A" * 300] * 7)
        buffer._flush()
        assert [len(frame) for frame in client.frames] == [client._frame_max] * 2 + [13 + 320]
        assert client.frames[0] == rstreams(1, [(i, amqp(b"A" * 300)) for i in (1, 2, 3)])
        client.frames.clear()
        for pid in (8, 9, 10):  # put() counts it the same way: the fourth would not fit
            assert buffer.put(pid, b"B" * 300, None) == QUEUED
        assert buffer.put(11, b"B" * 300, None) == NOT_QUEUED
        await buffer.add(11, b"B" * 300)  # what send() does then: a new frame
        buffer._flush()
        assert [len(frame) for frame in client.frames] == [client._frame_max, 13 + 320]

        tight = PublishBuffer(FakeClient(), 1, "s", BatchingPolicy(linger=5))
        tight.frame_max = 13 + 12 + 1000  # a 1000-byte body fits raw, not with its 8 bytes of data section
        with pytest.raises(MessageTooLarge, match="1000 bytes"):
            await tight.add(1, b"x" * 1000)
        with pytest.raises(MessageTooLarge):
            await tight.add_many(1, [b"x" * 1000])
        await tight.add(1, b"x" * 992)  # 1000 with its section: fits
        raw = PublishBuffer(FakeClient(), 1, "s", BatchingPolicy(linger=5), encoding="raw")
        raw.frame_max = tight.frame_max
        await raw.add(1, b"x" * 1000)

    asyncio.run(scenario())


def test_a_sub_entrys_records_are_data_sections_and_a_consumer_gets_the_bodies() -> None:
    bodies = [b"one", LONG, b""]
    carried = AMQPMessage(body=b"c", application_properties={"k": 1})
    for compression in ("none", "gzip"):
        entry = sub_entry([*bodies, carried], compression)
        records, _ = schema.SubEntryChunk.read(entry, entry[0], 1)
        assert [bytes(r) for r in records] == [*map(amqp, bodies), bytes(carried)]
        frame = decode_hot(deliver([entry, simple(amqp(b"after"))], records=5))
        assert messages_of(frame) == [*bodies, bytes(carried), b"after"]
        assert stored_of(frame) == [*map(amqp, bodies), bytes(carried), amqp(b"after")]
    records = b"".join(simple(amqp(b)) for b in bodies)
    assert encode_frame(schema.PublishSubBatching(
        publisher_id=3, number_of_root_messages=1, publishing_id=2, compress_type=0x80, subbatching_message_count=3,
        uncompressed_data_size=len(records), compressed_data_size=len(records), messages=records)
    )[21:] == sub_entry(bodies)  # rstream's frame: 4 size, 2 key, 2 version, 1 publisher, 4 count, 8 id
    assert sub_entry(bodies, encoding="raw")[11:] == b"".join(simple(b) for b in bodies)


# -- the consumer's split ---------------------------------------------------------------------------------------
def test_the_split_hands_over_bodies_and_keeps_every_other_message_whole() -> None:
    with_properties = bytes(AMQPMessage(body=b"abc", application_properties={"k": "v"}))
    messages = [amqp(b"a"), amqp(b""), amqp(EDGE), amqp(LONG), b"raw-1", with_properties,
                amqp(b"abc") + b"\x00",  # one more byte than its section says: not a bare data section
                b"\x00Su\xb0\x00\x00\x00\x05abc",  # a vbin32 claiming more than there is
                b"\x00Su\xa0\x01", b"", b"abcd"]  # and messages under 5 bytes at the frame's end
    bodies = [b"a", b"", EDGE, LONG, *messages[4:]]
    for tail, tail_bodies in (([], []), ([b""], [b""]), ([b"ab"], [b"ab"]), ([b"\x00Su"], [b"\x00Su"]),
                              ([amqp(b"")], [b""])):
        raw = deliver([simple(m) for m in messages + tail], records=len(messages + tail))
        ours = decode_hot(raw)
        assert messages_of(ours) == bodies + tail_bodies == [strip_data(m) for m in messages + tail]
        assert stored_of(ours) == messages + tail
        assert all(type(m) is bytes for m in messages_of(ours) + stored_of(ours))
        theirs = decode_frame(raw)  # a frame rstream decoded (the fallback) splits the same
        assert messages_of(theirs) == bodies + tail_bodies and stored_of(theirs) == messages + tail


def test_the_split_strips_exactly_what_strip_data_strips_over_random_messages() -> None:
    rng = random.Random(29)
    pool = [b"", b"\x00", b"\x00S", b"\x00Su", b"\x00Su\xa0", b"\x00Su\xb0\x00\x00"]
    for _ in range(300):
        messages = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.random()
            body = rng.randbytes(rng.choice((0, 1, 4, 8, 200, 255, 256, 300)))
            if kind < 0.4:
                messages.append(amqp(body))
            elif kind < 0.6:
                messages.append(amqp(body)[:-1] if body else amqp(body) + b"x")  # the length does not match
            elif kind < 0.8:
                messages.append(rng.choice(pool) + body)
            else:
                messages.append(body)
        frame = decode_hot(deliver([simple(m) for m in messages], records=len(messages)))
        assert stored_of(frame) == messages
        assert messages_of(frame) == [strip_data(m) for m in messages]


# -- decoding -----------------------------------------------------------------------------------------------------
def test_a_raw_message_in_chunk_messages_raises_a_typed_error_naming_its_offset() -> None:
    with_properties = AMQPMessage(body=b"p", application_properties={"k": "v"})
    messages = [amqp(b"one"), bytes(with_properties), b"raw-1", amqp(b"four")]
    frame = decode_hot(deliver([simple(m) for m in messages], records=4, first=500))
    chunk = chunk_of(frame, "orders", 500, 504, 0, None)
    assert chunk.bodies == [b"one", bytes(with_properties), b"raw-1", b"four"] and chunk.stored == messages
    with pytest.raises(MessageDecodeError, match=r"offset 502 of stream 'orders': .*not an AMQP 1\.0 message") \
            as caught:
        chunk.messages()
    assert (caught.value.stream, caught.value.offset) == ("orders", 502)
    assert isinstance(caught.value, ValueError)
    copy = pickle.loads(pickle.dumps(caught.value))  # crosses processes (Spark) intact
    assert (str(copy), copy.stream, copy.offset) == (str(caught.value), "orders", 502)

    later = chunk_of(frame, "orders", 501, 504, 1, None).after(502)  # the part after the raw one decodes
    assert [m.body for m in later.messages()] == [b"four"] and later.offsets == range(503, 504)
    first = chunk_of(frame, "orders", 500, 504, 0, None).after(499)
    decoded = Chunk("orders", range(500, 502), 0, first.bodies[:2], decode_amqp_message, first.stored[:2]).messages()
    assert decoded[0].body == b"one" and decoded[1].application_properties == {b"k": b"v"}

    kept = chunk_of(frame, "orders", 500, 504, 0, lambda body: body != b"raw-1")  # a filter: what it keeps
    assert kept.offsets == [500, 501, 503] and [m.body for m in kept.messages()] == [b"one", b"p", b"four"]


def test_decoding_garbage_raises_the_typed_error_never_the_decoders_own() -> None:
    for garbage in (b"", b"raw-1", b"\x00", b"\x00S", b"\x00S\x79", b"hello world garbage"):
        with pytest.raises(MessageDecodeError, match=r"not an AMQP 1\.0 message"):
            decode_amqp_message(garbage)
    rng = random.Random(3)
    whole = bytes(AMQPMessage(body=b"x" * 40, application_properties={"a": 1, "b": "two"}))
    failed = 0
    # cut or corrupted AMQP 1.0 messages: decoded, or refused with the typed error (not more: a corrupted count
    # can keep rstream's decoder busy for seconds, as the 915th of this seed does)
    for _ in range(800):
        broken = bytearray(whole[:rng.randint(4, len(whole))])
        for _ in range(rng.randint(0, 2)):
            broken[rng.randrange(3, len(broken))] = rng.randrange(256)
        try:
            decode_amqp_message(bytes(broken))
        except MessageDecodeError as exc:
            failed += 1
            assert exc.__cause__ is None or isinstance(exc.__cause__, (IndexError, TypeError, ValueError,
                                                                       KeyError, OverflowError, struct.error))
    assert failed > 50
    with pytest.raises(MessageDecodeError, match=r"the message at offset 7 of stream 's' is not") as caught:
        decode_amqp(b"raw-1", stream="s", offset=7)
    assert (caught.value.stream, caught.value.offset) == ("s", 7)
    assert decode_amqp(amqp(b"body")) == (b"body", None)


def test_a_message_already_encoded_for_a_sub_entry_is_written_as_it_is_not_wrapped_again() -> None:
    """The Spark sink encodes each row once (to size its groups) and sends those parts: a sub-entry of them is
    the sub-entry of the messages themselves, an AMQP 1.0 message not wrapped in a data section."""
    from smartclient.stream.publish_frames import Encoded, as_part

    message = AMQPMessage(body=b"row", application_properties={"k": "v"})
    part = as_part(message)
    assert type(part) is Encoded and as_part(part) is part
    assert sub_entry([part, b"raw"]) == sub_entry([message, b"raw"])
