"""Spark against the real cluster: the exactly-once sink (idempotence, an injected task failure, a
super stream) and the source (offset ranges, checkpoints, maxRecordsPerTrigger on PySpark 4.2+, a
stream's end with and without ``committed_offset``).  One local[2,4] session for all of them (the
``rabbitmq_spark`` fixture)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import Address, Environment, hash_partition
from smartclient.spark import ExactlyOnceSink, StreamConnection
from smartclient.testing import TestBed

from ..conftest import wait_until
from .conftest import load_example, read_stream

pytestmark = pytest.mark.spark


def connection_via_lb(bed: TestBed) -> StreamConnection:
    host, port = bed.lb("stream")
    return StreamConnection(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port)))


def rows(rabbitmq_spark: Any, start: int, count: int) -> Any:
    data = [(i, f"user-{i % 7}", json.dumps({"id": i, "user": f"user-{i % 7}"})) for i in range(start, start + count)]
    return rabbitmq_spark.createDataFrame(data, "id long, user string, body string")


async def test_sink_is_idempotent_for_a_batch_id(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    async with Environment(rabbitmq_testbed.stream_uri(rabbitmq_testbed.nodes[0].host,
                                                       rabbitmq_testbed.nodes[0].stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
    sink = ExactlyOnceSink(connection_via_lb(rabbitmq_testbed), app_id=rabbitmq_unique_name,
                           stream=rabbitmq_unique_name, key_columns=["user"], order_columns=["id"], slots=3)
    df = rows(rabbitmq_spark, 0, 200)
    await asyncio.to_thread(sink, df, 7)
    await asyncio.to_thread(sink, df, 7)  # the same batch again: nothing new
    got = await read_stream(rabbitmq_testbed, rabbitmq_unique_name)
    assert sorted(m["id"] for m in got) == list(range(200))


async def test_a_traced_sink_batch_is_one_span_on_the_driver_with_its_rows(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    trace_sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is needed")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = trace_sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Environment(rabbitmq_testbed.stream_uri(rabbitmq_testbed.nodes[0].host,
                                                       rabbitmq_testbed.nodes[0].stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
    sink = ExactlyOnceSink(connection_via_lb(rabbitmq_testbed), app_id=rabbitmq_unique_name,
                           stream=rabbitmq_unique_name, key_columns=["user"], order_columns=["id"], slots=2,
                           tracer_provider=provider)
    await asyncio.to_thread(sink, rows(rabbitmq_spark, 0, 50), 3)
    [span] = [s for s in exporter.get_finished_spans() if s.name == f"send {rabbitmq_unique_name}"]
    assert span.attributes["smartclient.spark.batch_id"] == 3
    assert span.attributes["messaging.batch.message_count"] == 50
    assert span.attributes["smartclient.spark.slots"] == 2
    assert len(await read_stream(rabbitmq_testbed, rabbitmq_unique_name)) == 50
    provider.shutdown()


@pytest.mark.parametrize("partitioning", ["slots", "input", "slots, one entry per row"])
async def test_streaming_query_with_an_injected_task_failure_is_exactly_once(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path, partitioning: str
) -> None:
    async with Environment(rabbitmq_testbed.stream_uri(rabbitmq_testbed.nodes[0].host,
                                                       rabbitmq_testbed.nodes[0].stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
    source = tmp_path / "in"
    source.mkdir()
    now = int(time.time())
    for part in range(3):  # three files, one batch each
        lines = [json.dumps({"id": i, "user": f"user-{i % 7}", "body": json.dumps({"id": i, "user": f"user-{i % 7}"})})
                 for i in range(part * 300, part * 300 + 300)]
        path = source / f"part-{part}.json"
        path.write_text("\n".join(lines) + "\n")
        # Spark's file source takes files in modification-time order; files written within the same tick
        # tie, and a tie is broken in no set order (CI once read part-2 before part-1)
        os.utime(path, (now - 10 + part, now - 10 + part))
    marker = tmp_path / "failed-once"

    def to_message(row: Any) -> bytes:
        if row["id"] == 450 and not marker.exists():  # half-way through a slot of the second batch
            marker.write_text("x")
            raise RuntimeError("injected task failure")
        return row["body"].encode()

    shape: dict[str, Any] = ({"partitioning": "input"} if partitioning == "input" else
                             {"key_columns": ["user"], "order_columns": ["id"], "slots": 3})
    # the defaults: sub-entries of up to 100 rows, by position, so a replayed task sends the same groups
    if partitioning == "slots, one entry per row":
        shape["sub_entry_size"] = 1
    sink = ExactlyOnceSink(connection_via_lb(rabbitmq_testbed), app_id=rabbitmq_unique_name,
                           stream=rabbitmq_unique_name, to_message=to_message, **shape)
    query = (rabbitmq_spark.readStream.schema("id long, user string, body string").option("maxFilesPerTrigger", 1)
             .json(str(source)).writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        await asyncio.to_thread(query.processAllAvailable)
    finally:
        query.stop()
    assert marker.exists()  # the failure did happen, and Spark retried the task
    got = await read_stream(rabbitmq_testbed, rabbitmq_unique_name)
    ids = [m["id"] for m in got]
    assert len(ids) == 900 and sorted(ids) == list(range(900))  # 0 missing, 0 duplicated
    if partitioning == "input":  # one file, one input partition per batch: written in the file's order
        assert ids == list(range(900))
    by_user: dict[str, list[int]] = defaultdict(list)
    for m in got:
        by_user[m["user"]].append(m["id"])
    for user, seq in by_user.items():
        assert seq == sorted(seq), user  # the order within each slot is kept


def test_every_slot_gets_a_spark_partition_of_its_own(rabbitmq_spark: Any) -> None:
    """The sink repartitions by a key column chosen so that slot s lands in partition s: one producer
    per task, and the tasks evenly loaded (the key's type once differed from the one the keys were
    found for, and 4 slots filled 3 partitions, one of them with two slots)."""
    from pyspark.sql import functions as F

    from smartclient.spark.sink import PART_COLUMN, SLOT_COLUMN, _partition_keys

    for count in (2, 4, 7):
        slots = rabbitmq_spark.range(700).select((F.col("id") % count).cast("int").alias(SLOT_COLUMN))
        spread = (slots.withColumn(PART_COLUMN, _partition_keys(rabbitmq_spark, count)[F.col(SLOT_COLUMN)])
                  .repartition(count, PART_COLUMN).rdd
                  .mapPartitionsWithIndex(lambda index, rows: [(index, sorted({row[0] for row in rows}))]).collect())
        assert sorted(spread) == [(slot, [slot]) for slot in range(count)], (count, spread)


async def test_super_stream_sink_routes_every_row_by_the_java_compatible_hash(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        sink = ExactlyOnceSink(connection_via_lb(rabbitmq_testbed), app_id=rabbitmq_unique_name,
                               super_stream=rabbitmq_unique_name, key_columns=["user"], order_columns=["id"])
        await asyncio.to_thread(sink, rows(rabbitmq_spark, 0, 140), 0)
        total = 0
        for partition in partitions:
            got = await read_stream(rabbitmq_testbed, partition)
            total += len(got)
            for m in got:
                assert hash_partition(m["user"], partitions) == partition, m
        assert total == 140
    finally:
        async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
            await env.delete_super_stream(rabbitmq_unique_name)


async def fill(bed: TestBed, stream: str, start: int, count: int, size: int | None = None) -> None:
    """``count`` messages ``{"id": i}`` from ``start``; with ``size``, bodies of exactly that many bytes."""
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        await env.create_stream(stream, exists_ok=True)
        producer = await env.producer(stream)
        bodies = [json.dumps({"id": i}).encode() for i in range(start, start + count)]
        await producer.send_batch(bodies if size is None else [body.ljust(size) for body in bodies])
        await producer.close()


def source(rabbitmq_spark: Any, bed: TestBed, stream: str, streaming: bool = False) -> Any:
    from smartclient.spark import RabbitStreamDataSource

    rabbitmq_spark.dataSource.register(RabbitStreamDataSource)
    host, port = bed.lb("stream")
    reader = rabbitmq_spark.readStream if streaming else rabbitmq_spark.read
    return (reader.format("rabbitmq_stream").option("uri", bed.stream_uri(host, port))
            .option("loadBalancer", f"{host}:{port}").option("streams", stream))


async def test_batch_read_returns_exactly_an_offset_range(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    await fill(rabbitmq_testbed, rabbitmq_unique_name, 0, 100)
    stream = rabbitmq_unique_name
    df = (source(rabbitmq_spark, rabbitmq_testbed, stream).option("startingOffsets", json.dumps({stream: 10}))
          .option("endingOffsets", json.dumps({stream: 60})).option("maxRecordsPerPartition", "20").load())
    from smartclient.spark import RabbitStreamDataSource
    from smartclient.spark.source import OffsetRange

    host, port = rabbitmq_testbed.lb("stream")
    reader = RabbitStreamDataSource({"uri": rabbitmq_testbed.stream_uri(host, port), "streams": stream,
                                     "startingOffsets": json.dumps({stream: 10}),
                                     "endingOffsets": json.dumps({stream: 60}), "maxRecordsPerPartition": "20"}
                                    ).reader(None)  # what Spark calls, through the public DataSource API
    assert list(reader.partitions()) == [OffsetRange(stream, 10, 30), OffsetRange(stream, 30, 50),
                                         OffsetRange(stream, 50, 60)]
    got = await asyncio.to_thread(df.collect)
    assert sorted(r.offset for r in got) == list(range(10, 60))
    assert all(json.loads(bytes(r.body))["id"] == r.offset and r.stream == rabbitmq_unique_name for r in got)
    everything = await asyncio.to_thread(source(rabbitmq_spark, rabbitmq_testbed, rabbitmq_unique_name).load().count)
    assert everything == 100  # earliest to latest by default


async def test_a_range_retention_removed_fails_naming_the_lost_offsets_or_is_skipped_with_fail_on_data_loss_off(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    from smartclient import StreamArguments

    stream = rabbitmq_unique_name
    host, port = rabbitmq_testbed.lb("stream")
    async with Environment(rabbitmq_testbed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port))) as env:
        await env.create_stream(stream, StreamArguments(max_length_bytes=60_000, max_segment_size_bytes=20_000))
        producer = await env.producer(stream)
        for start in range(0, 600, 50):  # 600 messages of about 1 kB, a chunk of 50 at a time: segments roll
            await producer.send_batch([json.dumps({"id": i, "pad": "x" * 1000}).encode()
                                       for i in range(start, start + 50)])
        first: list[int] = []

        async def truncated() -> bool:
            first[:] = [int((await env.stream_stats(stream)).get("first_chunk_id", 0))]
            return first[0] > 0

        await wait_until(truncated, 30, lambda: f"retention to remove the first segment of {stream}")
    df = source(rabbitmq_spark, rabbitmq_testbed, stream).option("startingOffsets", json.dumps({stream: 0}))
    with pytest.raises(Exception, match=rf"offsets 0 to \d+ of stream '{stream}' are gone") as failed:
        await asyncio.to_thread(df.load().collect)
    print(f"failOnDataLoss=true: {str(failed.value).splitlines()[0][:200]}")
    got = await asyncio.to_thread(df.option("failOnDataLoss", "false").load().collect)
    offsets = sorted(r.offset for r in got)
    assert offsets == list(range(offsets[0], 600)) and offsets[0] >= first[0] > 0  # what is left, once


def micro_batches(spark: Any, bed: TestBed, streams: str, checkpoint: Path, available_now: bool = False,
                  progress: list[Any] | None = None, **options: str) -> list[list[tuple[str, int]]]:
    """Run a streaming query of the source until it has caught up (with ``available_now``: until it
    ends); the ``(stream, offset)`` rows of each micro-batch (and, into ``progress``, the query's progress
    of each batch that read rows)."""
    batches: list[list[tuple[str, int]]] = []
    reader = source(spark, bed, streams, streaming=True)
    for name, value in options.items():
        reader = reader.option(name, value)
    writer = (reader.load().writeStream.option("checkpointLocation", str(checkpoint))
              .foreachBatch(lambda df, batch_id: batches.append([(r.stream, r.offset) for r in df.collect()])))
    if available_now:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        if progress is not None:
            progress.extend(p for p in query.recentProgress if p.numInputRows)
        return batches
    query = writer.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return batches


def rows_of(stream: str, first: int, end: int) -> list[tuple[str, int]]:
    return [(stream, offset) for offset in range(first, end)]


def every_row(batches: list[list[tuple[str, int]]]) -> list[tuple[str, int]]:
    return sorted(row for batch in batches for row in batch)


async def test_streaming_read_resumes_from_its_checkpoint_without_gaps(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    stream = rabbitmq_unique_name
    await fill(rabbitmq_testbed, stream, 0, 30)
    batches = await asyncio.to_thread(micro_batches, rabbitmq_spark, rabbitmq_testbed, stream, tmp_path / "cp",
                                      maxRecordsPerPartition="10")
    assert every_row(batches) == rows_of(stream, 0, 30)
    await fill(rabbitmq_testbed, stream, 30, 20)
    batches = await asyncio.to_thread(micro_batches, rabbitmq_spark, rabbitmq_testbed, stream, tmp_path / "cp",
                                      maxRecordsPerPartition="10")  # a restart from the same checkpoint
    assert every_row(batches) == rows_of(stream, 30, 50)  # exactly the new messages: no gap, no replay


def _pyspark_has_admission_control() -> bool:
    from smartclient.spark.source import admission_control_supported

    return admission_control_supported()


needs_admission_control = pytest.mark.skipif(not _pyspark_has_admission_control(),
                                             reason="admission control needs PySpark 4.2+")


@needs_admission_control
async def test_max_records_per_trigger_caps_every_batch_and_delivers_each_record_once(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    a, b = f"{rabbitmq_unique_name}-a", f"{rabbitmq_unique_name}-b"
    await fill(rabbitmq_testbed, a, 0, 700)
    await fill(rabbitmq_testbed, b, 0, 300)
    options = {"maxRecordsPerTrigger": "300", "maxRecordsPerPartition": "100"}
    batches = await asyncio.to_thread(micro_batches, rabbitmq_spark, rabbitmq_testbed, f"{a},{b}", tmp_path / "cp",
                                      **options)
    assert every_row(batches) == rows_of(a, 0, 700) + rows_of(b, 0, 300)  # each record once
    sizes = [len(batch) for batch in batches]
    assert max(sizes) <= 300 and len([n for n in sizes if n]) >= 4, sizes
    await fill(rabbitmq_testbed, a, 700, 100)
    batches = await asyncio.to_thread(micro_batches, rabbitmq_spark, rabbitmq_testbed, f"{a},{b}", tmp_path / "cp",
                                      **options)  # a restart from the same checkpoint: exactly the new records
    assert every_row(batches) == rows_of(a, 700, 800) and max(len(batch) for batch in batches) <= 300


@needs_admission_control
async def test_trigger_available_now_reads_everything_in_capped_batches(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    from smartclient.spark.source import offsets_behind

    stream = rabbitmq_unique_name
    await fill(rabbitmq_testbed, stream, 0, 1000)
    progress: list[Any] = []
    batches = await asyncio.to_thread(micro_batches, rabbitmq_spark, rabbitmq_testbed, stream, tmp_path / "cp",
                                      available_now=True, progress=progress, maxRecordsPerTrigger="300")
    assert [len(batch) for batch in batches] == [300, 300, 300, 100]
    assert every_row(batches) == rows_of(stream, 0, 1000)
    # the source's metric: how far each batch's end was behind the stream's end when it was planned
    assert [offsets_behind(p) for p in progress] == [{stream: 700}, {stream: 400}, {stream: 100}, {stream: 0}]


@needs_admission_control
async def test_max_bytes_per_trigger_caps_batches_by_the_sampled_record_sizes(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    a, b = f"{rabbitmq_unique_name}-a", f"{rabbitmq_unique_name}-b"
    await fill(rabbitmq_testbed, a, 0, 400, size=1000)
    await fill(rabbitmq_testbed, b, 0, 400, size=100)
    batches = await asyncio.to_thread(micro_batches, rabbitmq_spark, rabbitmq_testbed, f"{a},{b}", tmp_path / "cp",
                                      available_now=True, maxBytesPerTrigger="110000")
    # 55 kB each: a takes 55 records, b all 400 (40 kB), and a the 15 kB b left; then 110 of a at a time
    sizes = [(sum(s == a for s, _ in batch), sum(s == b for s, _ in batch)) for batch in batches]
    assert sizes == [(70, 400), (110, 0), (110, 0), (110, 0)], sizes
    assert every_row(batches) == rows_of(a, 0, 400) + rows_of(b, 0, 400)


def progress_of(query: Any, timeout: float, what: str, test: Any) -> Any:
    """The first of ``query``'s recent progress reports that passes ``test``, waiting up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for progress in query.recentProgress:
            if test(progress):
                return progress
        if query.exception() is not None:
            raise AssertionError(f"the query failed waiting for {what}: {query.exception()}")
        time.sleep(0.05)
    raise AssertionError(f"no progress report showed {what} within {timeout:g} s: {query.recentProgress}")


def source_offsets(progress: Any, key: str) -> dict[str, int]:
    value = getattr(progress.sources[0], key)
    return json.loads(value) if isinstance(value, str) else {}


@needs_admission_control
async def test_min_offsets_per_trigger_holds_batches_until_enough_records_or_max_trigger_delay(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    stream = rabbitmq_unique_name
    await fill(rabbitmq_testbed, stream, 0, 100)
    batches: list[list[int]] = []
    # a progress report for every trigger, those with no batch too, so the test can see one held back
    rabbitmq_spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    query = (source(rabbitmq_spark, rabbitmq_testbed, stream, streaming=True)
             .option("minOffsetsPerTrigger", "250").option("maxTriggerDelay", "8s").load().writeStream
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="200 milliseconds")
             .foreachBatch(lambda df, _: batches.append(sorted(r.offset for r in df.collect()))).start())
    try:
        # the query's first trigger takes what there is, as Kafka's source does
        await wait_until(lambda: batches and batches[-1] == list(range(100)), 60, "the first batch")
        await fill(rabbitmq_testbed, stream, 100, 100)  # 100 new: fewer than 250, held back...
        held = await asyncio.to_thread(progress_of, query, 30, "a trigger that saw 100 new records and held them",
                                       lambda p: source_offsets(p, "latestOffset") == {stream: 200}
                                       and source_offsets(p, "endOffset") == {stream: 100})
        assert held.numInputRows == 0
        await fill(rabbitmq_testbed, stream, 200, 200)  # ... until there are 300
        await wait_until(lambda: len(batches) >= 2 and batches[-1], 60, "the batch of 300")
        assert [b for b in batches if b] == [list(range(100)), list(range(100, 400))]
        # too few, but the delay is up: 20 new records go on their own, 8 s or more after the last batch
        await fill(rabbitmq_testbed, stream, 400, 20)
        await wait_until(lambda: batches[-1] == list(range(400, 420)), 60, "the 20 records after the delay")
        ran = {n: await asyncio.to_thread(progress_of, query, 30, f"the batch of {n}",
                                          lambda p, n=n: p.numInputRows == n)
               for n in (300, 20)}  # (a batch's progress is reported after its foreachBatch has run)
        started = {n: datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")) for n, p in ran.items()}
        waited = (started[20] - started[300]).total_seconds()
        assert waited >= 8 - 0.5, f"20 records under minOffsetsPerTrigger went {waited:.1f} s after the last batch"
    finally:
        query.stop()
        rabbitmq_spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


class WithoutCommittedOffset:
    """An Environment whose StreamStats lacks ``committed_offset``, as RabbitMQ before 4.3 answers."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    async def stream_stats(self, stream: str) -> dict[str, int]:
        return {k: v for k, v in (await self.env.stream_stats(stream)).items() if k != "committed_offset"}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


async def test_a_streams_end_from_committed_offset_and_from_reading_its_last_chunk(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    from smartclient.stream.columnar import next_offset as _next_offset

    host, port = rabbitmq_testbed.lb("stream")
    async with Environment(rabbitmq_testbed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port))) as env:
        await env.create_stream(rabbitmq_unique_name)
        assert await _next_offset(env, rabbitmq_unique_name) == 0
        assert await _next_offset(WithoutCommittedOffset(env), rabbitmq_unique_name) == 0
        await fill(rabbitmq_testbed, rabbitmq_unique_name, 0, 121)
        if "committed_offset" in await env.stream_stats(rabbitmq_unique_name):  # RabbitMQ 4.3+
            assert await _next_offset(env, rabbitmq_unique_name) == 121
        assert await _next_offset(WithoutCommittedOffset(env), rabbitmq_unique_name) == 121  # the fallback


async def test_end_to_end_source_transform_sink_through_the_lb(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    pipeline = load_example("spark_foreach_batch")
    host, port = rabbitmq_testbed.lb("stream")
    uri = rabbitmq_testbed.stream_uri(host, port)
    source, target = f"{rabbitmq_unique_name}-in", f"{rabbitmq_unique_name}-out"
    await pipeline.publish_orders(uri, source, 500)
    await asyncio.to_thread(pipeline.run, rabbitmq_spark, uri, source, target, rabbitmq_unique_name,
                            str(tmp_path / "cp"))
    out = await pipeline.read_all(uri, target, expect=500)
    assert sorted(m["id"] for m in out) == list(range(500))
    assert all(m["with_tax"] == round(m["id"] * 1.5 * 1.2, 2) for m in out)
    # running the same query again from its checkpoint adds nothing
    await asyncio.to_thread(pipeline.run, rabbitmq_spark, uri, source, target, rabbitmq_unique_name,
                            str(tmp_path / "cp"))
    assert len(await pipeline.read_all(uri, target, expect=501, timeout=3)) == 500
