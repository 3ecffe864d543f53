"""A Deliver chunk as Arrow columns (smartclient/stream/_rstream/columns.py): the body column over the frame, with
no copy, equal to what the chunk's bodies are; through the one delivery path's chunk (skip, filter, ``after``).
No broker."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow", minversion="19")
np = pytest.importorskip("numpy")

from smartclient import ConfigurationError  # noqa: E402
from smartclient.core.amqp_data import data_section  # noqa: E402
from smartclient.core.delivery import Chunk  # noqa: E402
from smartclient.stream._rstream.columns import chunk_batch, chunk_of  # noqa: E402
from smartclient.stream._rstream.frames import decode_hot, messages_of  # noqa: E402
from tests.unit.fakes import deliver, delivered, simple, sub_batch  # noqa: E402

SIZES = (0, 1, 3, 4, 5, 7, 8, 12, 13, 14, 100, 255, 256, 300)


def bodies(batch: object) -> list[bytes]:
    return batch.column("body").to_pylist()  # type: ignore[attr-defined, no-any-return]


def check(batch: object, expected: list[bytes], offsets: list[int]) -> None:
    batch.validate(full=True)  # type: ignore[attr-defined]
    assert batch.schema.names == ["offset", "timestamp", "body"]  # type: ignore[attr-defined]
    assert bodies(batch) == expected
    assert batch.column("offset").to_pylist() == offsets  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("encoding", ["amqp", "raw"])
def test_messages_of_one_size_are_columns_equal_to_their_bodies(size: int, encoding: str) -> None:
    messages = [bytes([65 + i % 26]) * size for i in range(50)]
    f = delivered([data_section(m) for m in messages] if encoding == "amqp" else messages)
    batch = chunk_batch(f, 100)
    check(batch, messages_of(f), list(range(100, 150)))
    assert bodies(batch) == (messages if encoding == "amqp" else messages_of(f))
    check(chunk_batch(f, 100, [0, 7, 49]), [messages_of(f)[i] for i in (0, 7, 49)], [100, 107, 149])
    check(chunk_batch(f, 100, slice(45, None)), messages_of(f)[45:], list(range(145, 150)))


def test_messages_of_every_size_and_kind_in_one_chunk() -> None:
    messages = [data_section(bytes(range(n % 256)) * (1 + n // 256)) for n in SIZES]
    messages += [b"raw message", b"", b"\x00Su\xa0\x05abc", b"\x00Su\xb0\x00\x00\x00\x02ab", b"\x00Su\xa0"]
    f = delivered(messages, first=7)
    check(chunk_batch(f, 7), messages_of(f), list(range(7, 7 + len(messages))))


def test_the_body_column_is_a_view_into_the_frame_not_a_copy() -> None:
    for messages in ([data_section(b"m" * 100)] * 1000, [data_section(b"m" * (90 + i % 20)) for i in range(1000)]):
        f = delivered(messages)
        batch = chunk_batch(f, 0)
        raw = f.smartclient_raw  # type: ignore[attr-defined]
        assert batch.column("body").buffers()[2].address == np.frombuffer(raw, np.uint8).ctypes.data
        del f, raw
        assert bodies(batch)[-1].startswith(b"m")  # the column keeps the frame alive


def test_sub_entries_are_copied_once_into_the_column() -> None:
    raw = deliver([simple(data_section(b"m0")), simple(b"m1"), sub_batch([b"s2", b"s3"]),
                   sub_batch([b"g4", b"g5", b"g6"], 1)], records=7)
    f = decode_hot(raw)
    check(chunk_batch(f, 100), [b"m0", b"m1", b"s2", b"s3", b"g4", b"g5", b"g6"], list(range(100, 107)))
    check(chunk_batch(f, 100, [1, 5]), [b"m1", b"g5"], [101, 105])
    check(chunk_batch(f, 100, slice(3, None)), [b"s3", b"g4", b"g5", b"g6"], [103, 104, 105, 106])


def test_the_timestamp_is_the_chunks_in_milliseconds_utc() -> None:
    batch = chunk_batch(delivered([b"a", b"b"]), 0)
    assert str(batch.schema.field("timestamp").type) == "timestamp[ms, tz=UTC]"
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123] * 2


def test_an_empty_chunk_is_an_empty_batch() -> None:
    check(chunk_batch(delivered([]), 5), [], [])


def test_a_chunk_a_consumer_gets_gives_the_same_messages_as_columns() -> None:
    messages = [data_section(b"m%d" % i) for i in range(6)]
    f = delivered(messages, first=500)
    whole = chunk_of(f, "s", 500, 506, 0, None)
    check(whole.to_arrow(), whole.bodies, list(whole.offsets))
    skipped = chunk_of(f, "s", 502, 506, 2, None)  # a first chunk that begins before the consumer's offset
    check(skipped.to_arrow(), skipped.bodies, [502, 503, 504, 505])
    filtered = chunk_of(f, "s", 502, 506, 2, lambda body: body != b"m4")
    check(filtered.to_arrow(), [b"m2", b"m3", b"m5"], [502, 503, 505])
    check(whole.after(503).to_arrow(), [b"m4", b"m5"], [504, 505])
    check(filtered.after(502).to_arrow(), [b"m3", b"m5"], [503, 505])


def test_a_chunk_made_by_hand_has_no_columns() -> None:
    chunk = Chunk("s", range(3), 0, [b"a", b"b", b"c"], lambda message: message)
    with pytest.raises(ConfigurationError, match="was not read from a stream"):
        chunk.to_arrow()


def test_decoded_columns_hold_the_properties_and_application_properties() -> None:
    from rstream import AMQPMessage
    from rstream._pyamqp.message import Properties

    from smartclient import MessageDecodeError

    props = Properties(message_id="m-1", correlation_id=b"c-1", content_type="application/json",
                       creation_time=1_700_000_000_123, group_sequence=7, user_id=b"alice")
    messages = [bytes(AMQPMessage(body=b"one", properties=props, application_properties={"k": "v", "n": 3, "b": True})),
                data_section(b"two"), bytes(AMQPMessage(body=b"three"))]
    chunk = chunk_of(delivered(messages, first=10), "s", 10, 13, 0, None)
    batch = chunk.to_arrow(decode=True)
    batch.validate(full=True)
    assert batch.schema.names == ["offset", "timestamp", "body", "properties", "application_properties"]
    assert bodies(batch) == [b"one", b"two", b"three"] and batch.column("offset").to_pylist() == [10, 11, 12]
    first = batch.column("properties")[0].as_py()
    assert (first["message_id"], first["correlation_id"], first["content_type"], first["group_sequence"],
            first["user_id"]) == ("m-1", "c-1", "application/json", 7, b"alice")
    assert first["creation_time"].timestamp() == 1_700_000_000.123 and first["subject"] is None
    assert batch.column("properties")[1].as_py() is None  # a data section alone has no properties
    assert dict(batch.column("application_properties")[0].as_py()) == {"k": "v", "n": "3", "b": "true"}
    assert batch.column("application_properties")[2].as_py() is None
    assert chunk.after(10).to_arrow(decode=True).column("offset").to_pylist() == [11, 12]
    raw = chunk_of(delivered([b"not amqp", data_section(b"x")], first=5), "s", 5, 7, 0, None)
    with pytest.raises(MessageDecodeError, match="offset 5 of stream 's'"):
        raw.to_arrow(decode=True)
