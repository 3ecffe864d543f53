"""The seam's frame side (smartclient/stream/_rstream/frames.py) against rstream's own encoder and decoder, and
the one delivery loop (PlacedConsumer._on_deliver) over frames built in tests/unit/fakes.py.  No broker."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import fields
from typing import Any

import pytest
from rstream import schema
from rstream.connection import ConnectionClosed
from rstream.encoding import decode_frame, encode_frame

from smartclient.core.delivery import Chunk, ChunkHandler, MessageContext
from smartclient.core.flow import ConsumerFlow
from smartclient.stream._rstream.frames import decode_hot, messages_of, read_frame_raw
from tests.unit.fakes import FakeClient, carrier, confirm, deliver, hand_over, raw_of, simple, sub_batch, subscriber


def test_a_confirm_frame_decodes_to_rstreams_frame_with_its_ids_in_one_array() -> None:
    ids = [1, 2, 3, 2**40, 2**64 - 1]
    raw = raw_of(schema.PublishConfirm(publisher_id=7, publishing_ids=ids))
    ours, theirs = decode_hot(raw), decode_frame(raw)
    assert type(ours) is schema.PublishConfirm and ours.publisher_id == theirs.publisher_id == 7
    assert list(ours.publishing_ids) == theirs.publishing_ids == ids
    assert ours.corr_id is None  # rstream's listener asks every frame for it


def test_an_error_frame_decodes_to_rstreams_frame() -> None:
    errors = [schema.PublishingError(5, 18), schema.PublishingError(9, 6)]
    raw = raw_of(schema.PublishError(publisher_id=3, errors=errors))
    ours = decode_hot(raw)
    assert type(ours) is schema.PublishError and ours.publisher_id == 3
    assert ours.errors == decode_frame(raw).errors == errors


def test_a_deliver_frame_decodes_with_every_field_and_its_messages_as_rstream_reads_them() -> None:
    bodies = [b"a", b"", b"x" * 300]
    entries = [simple(b) for b in bodies] + [sub_batch([b"s1", b"s2"]), sub_batch([b"g1", b"g2", b"g3"], 1),
                                             simple(b"last")]
    raw = deliver(entries, records=9)
    ours, theirs = decode_hot(raw), decode_frame(raw)
    assert type(ours) is schema.Deliver
    names = [f.name for f in fields(schema.Deliver)]  # every field rstream's class has, set as it sets them
    assert {n: getattr(ours, n) for n in names if n != "data"} == {n: getattr(theirs, n) for n in names if n != "data"}
    assert bytes(ours.data) == theirs.data
    expected = [bytes(m) for m in theirs.get_messages()]
    assert messages_of(ours) == expected == [b"a", b"", b"x" * 300, b"s1", b"s2", b"g1", b"g2", b"g3", b"last"]
    assert all(type(m) is bytes for m in messages_of(ours))
    assert messages_of(theirs) == expected  # a frame rstream decoded splits the same


def test_frames_decoded_here_fall_back_to_rstream_on_what_they_do_not_expect() -> None:
    raw = bytearray(deliver([simple(b"abc")], records=1))
    raw[-1] ^= 0xFF  # the CRC no longer matches: rstream's decoder raises, as it always did
    assert decode_hot(bytes(raw)) is None
    with pytest.raises(ValueError):
        decode_frame(bytes(raw))
    assert decode_hot(raw_of(schema.Heartbeat())) is None  # not a hot-path frame: rstream decodes it
    assert decode_hot(deliver([simple(b"abc")], records=1)[:20]) is None  # cut short: rstream raises


def test_frames_are_read_whole_from_one_read_and_a_closed_socket_ends_the_reader_as_rstream_expects() -> None:
    async def scenario() -> list[bytes]:
        reader = asyncio.StreamReader()
        frames = [raw_of(schema.PublishConfirm(publisher_id=1, publishing_ids=[i])) for i in range(3)]
        reader.feed_data(b"".join(struct.pack(">I", len(f)) + f for f in frames) + b"\x00\x00")  # and a torn one
        reader.feed_eof()
        got = [await read_frame_raw(reader) for _ in frames]
        with pytest.raises(ConnectionClosed):
            await read_frame_raw(reader)
        return got

    assert [list(decode_hot(raw).publishing_ids) for raw in asyncio.run(scenario())] == [[0], [1], [2]]


# -- the delivery loop ------------------------------------------------------------------------------------
def test_each_message_gets_its_context_and_the_credit_goes_where_the_flow_says() -> None:
    sub, credits = subscriber(lambda message, context: None)
    consumer = carrier(ConsumerFlow(credit_after=0.5))
    hand_over(consumer, deliver([simple(b"m%d" % i) for i in range(4)], records=4), sub)
    assert [m for m, _ in sub.handed] == [b"m0", b"m1", b"m2", b"m3"]
    contexts = [c for _, c in sub.handed]
    assert all(type(c) is MessageContext for c in contexts)
    assert [c.offset for c in contexts] == [100, 101, 102, 103]
    assert contexts[0] == MessageContext(consumer, "s", 1, "name", 100, 1_700_000_000_123)
    assert credits == ["credit after 2"]  # half of the chunk, then the credit, once
    assert sub.offset == 104 and sub.smartclient_moved and consumer.smartclient_consumed["s"] == 4


def test_with_a_filter_the_credit_still_goes_at_its_share_of_the_chunk_not_of_what_passed() -> None:
    sub, credits = subscriber(lambda message, context: None)
    hand_over(carrier(ConsumerFlow(credit_after=0.5)), deliver([simple(b"m%d" % i) for i in range(10)], records=10),
              sub, keep=lambda message: message >= b"m4")
    assert [c.offset for _, c in sub.handed] == [104, 105, 106, 107, 108, 109]
    assert credits == ["credit after 1"]  # the 5th of 10 is the first handed over: the credit goes after it


def test_messages_before_the_consumers_offset_are_not_handed_over_and_the_position_moves_by_records() -> None:
    sub, credits = subscriber(lambda message, context: None, offset=102)
    hand_over(carrier(), deliver([simple(b"m0"), simple(b"m1"), sub_batch([b"s2", b"s3", b"s4"])], records=5), sub)
    assert [(m, c.offset) for m, c in sub.handed] == [(b"s2", 102), (b"s3", 103), (b"s4", 104)]
    assert credits == ["credit after 0"] and sub.offset == 105  # records, not entries (rstream moves by 3)


def test_a_chunk_handler_gets_the_whole_chunk_once_split_only_when_asked() -> None:
    chunks: list[Chunk] = []
    sub, credits = subscriber(None, offset=101)
    sub.callback = ChunkHandler(chunks.append)
    hand_over(carrier(), deliver([simple(b"m%d" % i) for i in range(4)], records=4), sub)
    (chunk,) = chunks
    assert chunk._bodies is None and len(chunk) == 3 and chunk.offsets == range(101, 104)  # not split yet
    assert chunk.bodies == [b"m1", b"m2", b"m3"] and list(chunk) == [(101, b"m1"), (102, b"m2"), (103, b"m3")]
    assert chunk.timestamp == 1_700_000_000_123 and (chunk.first_offset, chunk.last_offset) == (101, 103)
    assert chunk.after(101).offsets == range(102, 104) and chunk.after(99) is chunk and len(chunk.after(103)) == 0
    assert credits == ["credit after 0"] and sub.offset == 104


def test_a_callback_that_raises_still_gives_the_credit_once_and_the_position_stays() -> None:
    def fail(message: Any, context: Any) -> None:
        if context.offset == 101:
            raise RuntimeError("the application's")

    sub, credits = subscriber(fail, offset=None)
    with pytest.raises(RuntimeError):
        hand_over(carrier(ConsumerFlow(credit_after=1.0)), deliver([simple(b"a"), simple(b"b"), simple(b"c")], 3), sub)
    assert credits == ["credit after 2"] and sub.offset is None  # the chunk was not handed over whole


# -- the publish path's frames ------------------------------------------------------------------------------
def test_every_publish_path_writes_the_frames_rstreams_encoder_writes() -> None:
    """put() (send's hot path), add(), add_many() with bodies of other types, resume() after a loss, and a
    filter value's version 2, with encoding="raw": each frame is byte for byte the one rstream encodes for the same
    messages (the default encoding's frames: tests/unit/stream/test_amqp_encoding.py)."""
    from rstream.encoding import encode_publish

    from smartclient import BatchingPolicy
    from smartclient.stream.publishing import QUEUED, PublishBuffer


    def rstreams(publisher: int, messages: list[tuple[int, bytes, str | None]], version: int = 1) -> bytes:
        return encode_publish(schema.Publish(publisher_id=publisher, messages=[
            schema.Message(publishing_id=pid, filter_value=value, data=body) for pid, body, value in messages]),
            version)

    async def scenario() -> None:
        client = FakeClient()
        buffer = PublishBuffer(client, 4, "s", BatchingPolicy(batch_size=3, linger=5), encoding="raw")
        assert [buffer.put(pid, b"m%d" % pid, None) for pid in (1, 2)] == [QUEUED, QUEUED]
        await buffer.add(3, bytearray(b"third"))  # not bytes: the slow path, the same frame
        await buffer.add_many(4, [b"a", memoryview(b"bb"), b"ccc", b"dddd"])  # 3 fill a frame, 1 waits
        buffer._flush()
        assert client.frames == [rstreams(4, [(1, b"m1", None), (2, b"m2", None), (3, b"third", None)]),
                                 rstreams(4, [(4, b"a", None), (5, b"bb", None), (6, b"ccc", None)]),
                                 rstreams(4, [(7, b"dddd", None)])]
        buffer.suspend()
        client.frames.clear()
        assert buffer.resume(client, 9) == 7  # every pending message again, in order, on the new publisher
        assert client.frames == [rstreams(9, [(1, b"m1", None), (2, b"m2", None), (3, b"third", None)]),
                                 rstreams(9, [(4, b"a", None), (5, b"bb", None), (6, b"ccc", None)]),
                                 rstreams(9, [(7, b"dddd", None)])]
        filtered_client = FakeClient()
        filtered = PublishBuffer(filtered_client, 2, "s", BatchingPolicy(batch_size=2, linger=5),
                                 filter_value=lambda body: body[:1].decode(), encoding="raw")
        assert filtered.put(1, b"x1", None) == 0  # a filter value: never the hot path
        await filtered.add(1, b"x1")
        await filtered.add_many(2, [b"y2"])
        assert filtered_client.frames == [rstreams(2, [(1, b"x1", "x"), (2, b"y2", "y")], 2)]

    asyncio.run(scenario())


def test_send_many_fills_each_frame_to_its_max_with_large_bodies_and_counts_what_it_queued_with_a_filter() -> None:
    from rstream.encoding import encode_publish

    from smartclient import BatchingPolicy, EnqueueTimeout
    from smartclient.stream.publishing import PublishBuffer


    async def scenario() -> None:
        client = FakeClient()
        client._frame_max = 1000  # 13 bytes of header, then 312 per 300-byte message: 3 to a frame
        buffer = PublishBuffer(client, 1, "s", BatchingPolicy(batch_size=100, linger=5), encoding="raw")
        bodies = [bytes([65 + i]) * 300 for i in range(7)]
        await buffer.add_many(1, bodies)
        buffer._flush()
        assert client.frames == [encode_publish(schema.Publish(publisher_id=1, messages=[
            schema.Message(publishing_id=1 + i, filter_value=None, data=bodies[i]) for i in part]))
            for part in ((0, 1, 2), (3, 4, 5), (6,))]
        filtered = PublishBuffer(FakeClient(), 0, "s", BatchingPolicy(batch_size=2, linger=0.001, max_in_flight=4,
                                                                      enqueue_timeout=0.05),
                                 filter_value=lambda body: "v")
        with pytest.raises(EnqueueTimeout) as caught:
            await filtered.add_many(1, [b"m"] * 7)
        assert caught.value.queued == 4 and sorted(filtered._pending) == [1, 2, 3, 4]  # ids 1-4 stay taken

    asyncio.run(scenario())


def test_a_sub_entry_is_one_entry_of_many_messages_in_a_frame_of_its_own_and_counts_its_messages() -> None:
    """send_sub_entry's frames (encoding="raw"): a sub-entry frame is byte for byte rstream's PublishSubBatching;
    plain messages and sub-entries never share a frame and go out in publishing-id order, on a resume too; a
    confirm of a sub-entry counts its messages; a consumer splits it back into them (plain and gzip)."""
    from smartclient import BatchingPolicy, ConfigurationError
    from smartclient.stream.publish_frames import sub_entry as sub_entry_of
    from smartclient.stream.publishing import NOT_QUEUED, QUEUED, PublishBuffer

    def sub_entry(bodies: list[bytes], compression: str = "none") -> bytes:
        return sub_entry_of(bodies, compression, "raw")


    bodies = [b"one", b"two", b"three"]
    for compression, code in (("none", 0), ("gzip", 1)):
        entry = sub_entry(bodies, compression)
        records, used = schema.SubEntryChunk.read(entry, entry[0], 1)
        assert [bytes(r) for r in records] == bodies and used == len(entry) - 1 and entry[0] == 0x80 | code << 4
        assert messages_of(decode_hot(deliver([entry, simple(b"after")], records=4))) == [*bodies, b"after"]
    for bad, match in (([], "1 to 65535"), ([b"x"] * 65536, "1 to 65535")):
        with pytest.raises(ConfigurationError, match=match):
            sub_entry(bad)
    with pytest.raises(ConfigurationError, match="compression 'lz4'"):
        sub_entry(bodies, "lz4")

    async def scenario() -> None:
        client = FakeClient()
        buffer = PublishBuffer(client, 3, "s", BatchingPolicy(batch_size=10, linger=5), encoding="raw")
        assert buffer.put(1, b"plain-1", None) == QUEUED
        await buffer.add_entry(2, sub_entry(bodies), 3)  # the plain batch goes first
        await buffer.add_entry(3, sub_entry([b"four"]), 1)  # sub-entries share a frame
        assert buffer.put(4, b"plain-4", None) == NOT_QUEUED  # not the hot path behind sub-entries: add() is
        await buffer.add(4, b"plain-4")
        buffer._flush()
        records = b"".join(simple(b) for b in bodies)
        rstreams_sub = encode_frame(schema.PublishSubBatching(
            publisher_id=3, number_of_root_messages=1, publishing_id=2, compress_type=0x80,
            subbatching_message_count=3, uncompressed_data_size=len(records), compressed_data_size=len(records),
            messages=records))
        two = struct.pack(">Q", 2) + sub_entry(bodies) + struct.pack(">Q", 3) + sub_entry([b"four"])
        assert client.frames[1] == struct.pack(">IHHBI", 9 + len(two), 2, 1, 3, 2) + two
        assert [struct.unpack_from(">Q", f, 13)[0] for f in client.frames] == [1, 2, 4]  # in id order
        single = PublishBuffer(FakeClient(), 3, "s", BatchingPolicy(batch_size=10, linger=5), encoding="raw")
        await single.add_entry(2, sub_entry(bodies), 3)
        single._flush()
        assert single.client.frames == [rstreams_sub]  # one sub-entry: exactly rstream's frame
        assert buffer.sent == 1 + 3 + 1 + 1 and buffer.in_flight == 4
        written = list(client.frames)
        buffer.suspend()
        client.frames.clear()
        assert buffer.resume(client, 3) == 6 and client.frames == written  # 6 messages again: the same frames, in order
        assert buffer.resent == 6
        confirm(buffer, 1, 2)
        assert buffer.confirmed == 4 and buffer.in_flight == 2  # 1 plain + a sub-entry of 3
        confirm(buffer, 2, 3, 4)
        assert buffer.confirmed == 6 and buffer.in_flight == 0 and not buffer._sub_counts
        filtered = PublishBuffer(FakeClient(), 0, "s", BatchingPolicy(), filter_value=lambda body: "v")
        with pytest.raises(ConfigurationError, match="filter value"):
            await filtered.add_entry(1, sub_entry(bodies), 3)

    asyncio.run(scenario())
