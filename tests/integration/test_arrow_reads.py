"""Arrow reads against the test bed (``env.read_arrow``, ``env.iter_arrow``, ``chunk.to_arrow()``): every offset
once and in order, from anywhere to anywhere, with sub-entries, with a filter, with offset-tracking chunks at the
end, and across a recovery; the bodies as sent; on a replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow", minversion="19")

from smartclient import DataLoss, Environment, OffsetTracking, Role, StreamArguments, StreamFilter  # noqa: E402
from smartclient.sync import SyncEnvironment  # noqa: E402
from smartclient.testing import TestBed  # noqa: E402

from ..conftest import wait_until  # noqa: E402
from .conftest import all_nodes, node_index, numbered, publish, stream_led_by  # noqa: E402


@pytest.fixture
async def cluster_env(rabbitmq_testbed: TestBed) -> AsyncIterator[Environment]:
    """An Environment given every node as an entry point."""
    async with Environment(all_nodes(rabbitmq_testbed)) as environment:
        yield environment


def offsets(table: Any) -> list[int]:
    return table.column("offset").to_pylist()  # type: ignore[no-any-return]


def numbers(table: Any) -> list[int]:
    return [int(body.split(b":")[0]) for body in table.column("body").to_pylist()]


async def test_a_range_is_read_whole_once_and_in_order_as_columns_over_the_frames(cluster_env: Environment,
                                                                                  stream: str) -> None:
    await publish(cluster_env, stream, numbered(3000, suffix=b":", size=100))
    table = await cluster_env.read_arrow(stream)  # to where the stream ends now
    assert table.schema.names == ["offset", "timestamp", "body"]
    assert str(table.schema.field("body").type) == "binary_view"
    assert offsets(table) == list(range(3000)) and numbers(table) == list(range(3000))
    assert all(len(body) == 100 for body in table.column("body").to_pylist())
    assert table.column("timestamp").cast(pa.int64())[0].as_py() > 1_700_000_000_000  # ms since the epoch

    middle = await cluster_env.read_arrow(stream, 123, 1701)  # from and to the middle of chunks
    assert offsets(middle) == list(range(123, 1701)) and numbers(middle) == list(range(123, 1701))
    assert (await cluster_env.read_arrow(stream, 2999, 3000)).num_rows == 1
    assert (await cluster_env.read_arrow(stream, 5, 5)).num_rows == 0

    batches = [batch async for batch in cluster_env.iter_arrow(stream, 0, 3000)]
    assert len(batches) > 1 and sum(b.num_rows for b in batches) == 3000  # one batch per chunk
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(3000))


def test_the_synchronous_environment_reads_a_range_too(rabbitmq_testbed: TestBed, rabbitmq_unique_name: str) -> None:
    with SyncEnvironment(all_nodes(rabbitmq_testbed)) as env:
        env.create_stream(rabbitmq_unique_name)
        try:
            env.producer(rabbitmq_unique_name).send_batch([b"%d:" % i for i in range(10)])
            assert numbers(env.read_arrow(rabbitmq_unique_name, 2)) == list(range(2, 10))
            batches = list(env.iter_arrow(rabbitmq_unique_name, 0, 10))
            assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(10))
            for _ in env.iter_arrow(rabbitmq_unique_name, 0, 10):
                break  # (left early: its consumer closes)
        finally:
            env.delete_stream(rabbitmq_unique_name)


async def test_a_range_past_the_end_waits_for_its_messages(cluster_env: Environment, stream: str) -> None:
    await publish(cluster_env, stream, numbered(100, suffix=b":"))
    reading = asyncio.ensure_future(cluster_env.read_arrow(stream, 50, 300))
    await asyncio.sleep(0)
    await publish(cluster_env, stream, numbered(200, 100, suffix=b":"))
    table = await asyncio.wait_for(reading, 30)
    assert offsets(table) == list(range(50, 300)) and numbers(table) == list(range(50, 300))


async def test_sub_entries_are_read_as_their_messages(cluster_env: Environment, stream: str) -> None:
    producer = await cluster_env.producer(stream)
    await producer.send_wait(b"0:plain")
    await producer.send_sub_entry([b"%d:sub" % i for i in range(1, 101)])
    await producer.send_sub_entry([b"%d:gzip" % i for i in range(101, 601)], compression="gzip")
    await producer.send_wait(b"601:plain")
    await producer.close()
    table = await cluster_env.read_arrow(stream)
    assert offsets(table) == list(range(602)) and numbers(table) == list(range(602))
    assert offsets(await cluster_env.read_arrow(stream, 50, 150)) == list(range(50, 150))


async def test_a_filtered_read_gives_the_matching_offsets_and_ends_where_the_others_follow(
    cluster_env: Environment, rabbitmq_unique_name: str
) -> None:
    await cluster_env.create_stream(rabbitmq_unique_name, StreamArguments(filter_size_bytes=32))
    try:
        producer = await cluster_env.producer(rabbitmq_unique_name,
                                              filter_value=lambda body: body.split(b":")[1].decode())
        for value in ("a", "b", "a", "b", "a"):  # a chunk each, the last ones skipped by the filter
            await producer.send_batch([b"%d:%s" % (i, value.encode()) for i in range(100)])
        await producer.close()
        began = time.monotonic()
        table = await asyncio.wait_for(cluster_env.read_arrow(rabbitmq_unique_name, filter=StreamFilter(
            ["b"], post_filter=lambda m: bytes(m).endswith(b":b")), settle=0.5), 30)
        assert offsets(table) == [*range(100, 200), *range(300, 400)]
        assert {body.split(b":")[1] for body in table.column("body").to_pylist()} == {b"b"}
        print(f"filtered read ended {time.monotonic() - began:.2f} s after it began (settle 0.5 s)")
    finally:
        await cluster_env.delete_stream(rabbitmq_unique_name)


async def test_offset_tracking_chunks_at_the_end_do_not_hold_the_read(cluster_env: Environment, stream: str) -> None:
    await publish(cluster_env, stream, numbered(500, suffix=b":"))
    tracked = await cluster_env.consumer(stream, lambda message, context: None, offset="first", name="reader",
                                 tracking=OffsetTracking(every=None))
    await wait_until(lambda: tracked.last_offset == 499, 10, "the tracked consumer to read all")
    await tracked.store_offset()  # an offset-tracking chunk: offset 500, never handed to a consumer
    await tracked.close()

    async def stored() -> bool:  # (4.3 tells the committed offset; 4.0 only where the last chunk starts)
        # (any member: it may trail)
        return (await cluster_env.stream_stats(stream)).get("committed_offset", 500) == 500

    await wait_until(stored, 10, "the offset-tracking chunk to be committed")
    table = await asyncio.wait_for(cluster_env.read_arrow(stream, settle=0.5), 20)
    assert offsets(table) == list(range(500))
    await publish(cluster_env, stream, numbered(10, 500, suffix=b":"))  # offsets 501..510 after it
    assert numbers(await cluster_env.read_arrow(stream, 400)) == [*range(400, 500), *range(500, 510)]


async def test_offsets_removed_by_retention_raise_data_loss_or_are_skipped(cluster_env: Environment,
                                                                           rabbitmq_unique_name: str) -> None:
    stream = rabbitmq_unique_name
    await cluster_env.create_stream(stream, StreamArguments(max_length_bytes=60_000, max_segment_size_bytes=20_000))
    try:
        producer = await cluster_env.producer(stream)
        for start in range(0, 600, 50):  # 600 messages of about 1 kB, a chunk of 50 at a time: segments roll
            await producer.send_batch([(b"%d:" % i).ljust(1000, b"x") for i in range(start, start + 50)])
        await producer.close()
        first: list[int] = []

        async def truncated() -> bool:
            first[:] = [int((await cluster_env.stream_stats(stream)).get("first_chunk_id", 0))]
            return first[0] > 0

        await wait_until(truncated, 30, lambda: f"retention to remove the first segment of {stream}")
        # (retention may remove more segments meanwhile: what is gone is at least what was seen gone)
        with pytest.raises(DataLoss, match=rf"offsets 0 to \d+ of stream '{stream}' are gone") as lost:
            await cluster_env.read_arrow(stream, 0, 600)
        assert (lost.value.stream, lost.value.first) == (stream, 0) and 600 > lost.value.end >= first[0]
        assert str(lost.value).startswith(f"offsets 0 to {lost.value.end - 1} of")
        table = await cluster_env.read_arrow(stream, 0, 600, fail_on_data_loss=False)
        kept = offsets(table)
        assert kept == list(range(kept[0], 600)) and kept[0] >= lost.value.end and numbers(table) == kept
    finally:
        await cluster_env.delete_stream(stream)


@pytest.mark.faults
async def test_a_read_recovers_from_a_closed_connection_without_a_gap_or_duplicate(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    async with stream_led_by(bed, rabbitmq_unique_name, 0) as stream, Environment(all_nodes(bed)) as env:
        await publish(env, stream, numbered(30_000, suffix=b":", size=100))
        got: list[int] = []
        closed = False
        async for batch in env.iter_arrow(stream, 0, 30_000):
            got.extend(batch.column("offset").to_pylist())
            if not closed and len(got) >= 5_000:
                [record] = [r for r in env.placements() if r.role is Role.CONSUMER and r.stream == stream]
                assert node_index(bed, record.node) != 0  # on a replica
                bed.close_connection(bed.connection_named(record.connection))
                closed = True
            await asyncio.sleep(0.005)  # a slow reader: the queue fills, the consumer's credit waits
        assert closed and got == list(range(30_000))


async def test_a_decoded_read_has_the_properties_as_columns_and_names_a_raw_messages_offset(cluster_env: Environment,
                                                                                          stream: str) -> None:
    from rstream import AMQPMessage

    from smartclient import MessageDecodeError

    producer = await cluster_env.producer(stream)
    await producer.send_wait(AMQPMessage(body=b"0:props", application_properties={"region": "eu", "n": 1}))
    await producer.send_wait(b"1:plain")
    raw = await cluster_env.producer(stream, encoding="raw")
    await raw.send_wait(b"2:raw")
    table = await cluster_env.read_arrow(stream, 0, 2, decode=True)
    assert numbers(table) == [0, 1] and table.schema.names[-2:] == ["properties", "application_properties"]
    assert dict(table.column("application_properties")[0].as_py()) == {"region": "eu", "n": "1"}
    with pytest.raises(MessageDecodeError, match="offset 2 of stream"):
        await cluster_env.read_arrow(stream, decode=True)
