"""The ``rabbitmq_stream`` format's writers against the real cluster, through the load balancer: ``df.write`` and
``df.writeStream`` exactly once (a task failing half-way through its partition, a micro-batch replayed from the
checkpoint, the same batch write run again), sub-entries compressed, a super stream routed by the Java-compatible
hash, and bad options as typed errors.  The shared local session (``rabbitmq_spark``)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from smartclient import Environment, hash_partition
from smartclient.spark import RabbitStreamDataSource
from smartclient.testing import TestBed

from ..conftest import wait_until
from .conftest import forget_last_commit, in_thread, read_stream, stored

pytestmark = pytest.mark.spark


def through_lb(bed: TestBed, **more: str) -> dict[str, str]:
    host, port = bed.lb("stream")
    return {"uri": bed.stream_uri(host, port), "loadBalancer": f"{host}:{port}", **more}


@pytest.fixture
def spark(rabbitmq_spark: Any) -> Any:
    rabbitmq_spark.dataSource.register(RabbitStreamDataSource)
    return rabbitmq_spark


async def create_stream(bed: TestBed, name: str) -> None:
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        await env.create_stream(name)


@contextmanager
def small_arrow_batches(spark: Any, rows: int) -> Iterator[None]:
    """Arrow batches of ``rows`` rows into Python: a writer that keeps its input's order publishes each as it
    comes, so a failure part-way through a partition leaves part of it written."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, str(rows))
    try:
        yield
    finally:
        spark.conf.set(key, before)


def save(df: Any, options: dict[str, str]) -> None:
    """``df.write`` in the format, on this thread: Spark looks a Python data source up in the session active on the
    calling thread, and a thread of its own (``asyncio.to_thread``) has none."""
    df.write.format("rabbitmq_stream").mode("append").options(**options).save()


def failing_once(marker: Path, at: int, *, pad: int = 0, release: Path | None = None) -> Any:
    """A UDF that makes the body of row ``id`` (``pad`` bytes more), and fails the first time it meets ``at``; with
    ``release``, only once that file exists (the marker is written first: the test sees the task held)."""
    from pyspark.sql.functions import udf

    def body(i: int) -> str:
        if i == at and not marker.exists():
            marker.write_text("x")
            deadline = time.monotonic() + 120
            while release is not None and not release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("injected task failure")
        return json.dumps({"id": i, "user": f"user-{i % 7}", **({"pad": "x" * pad} if pad else {})})

    return udf(body, "string", useArrow=False)


@pytest.mark.requires_rabbitmq("4.3", reason="it counts the stream's messages by StreamStats' committed_offset")
async def test_a_batch_write_is_exactly_once_when_a_task_fails_half_way_and_when_it_is_run_again(
    spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col

    await create_stream(rabbitmq_testbed, rabbitmq_unique_name)
    marker, release = tmp_path / "failed-once", tmp_path / "release"
    # 1 KiB bodies: the JVM hands the writer its input through a 64 KiB buffer, and the rows before the failure
    # must reach it; the failure is held until some of them are in the stream
    df = spark.range(0, 600, numPartitions=3).select(
        col("id"), failing_once(marker, 350, pad=1000, release=release)(col("id")).alias("body"))
    options = through_lb(rabbitmq_testbed, stream=rabbitmq_unique_name, appId=rabbitmq_unique_name, batchId="5",
                         keepInputOrder="true", subEntrySize="10")
    with small_arrow_batches(spark, 20):
        run = in_thread(spark, lambda: save(df, options))
        try:
            await wait_until(marker.exists, 120, "the second partition's task to reach its failing row")
            async def failing_partitions_rows() -> list[int]:
                if not await stored(rabbitmq_testbed, rabbitmq_unique_name):
                    return []
                got = await read_stream(rabbitmq_testbed, rabbitmq_unique_name)
                return [m["id"] for m in got if 200 <= m["id"] < 350]

            before = await wait_until(failing_partitions_rows, 60, "the failing task's first rows in the stream",
                                      interval=0.2)
        finally:
            release.write_text("go")
        await asyncio.wait_for(run, 180)
    ids = [m["id"] for m in await read_stream(rabbitmq_testbed, rabbitmq_unique_name)]
    assert before == list(range(200, 200 + len(before)))  # its partition written part-way when the task failed
    assert sorted(ids) == list(range(600))  # 0 missing, 0 duplicated
    for first in (0, 200, 400):  # each partition in its own order
        assert [i for i in ids if first <= i < first + 200] == list(range(first, first + 200))

    again = spark.range(0, 600, numPartitions=3).select(
        col("id"), failing_once(marker, -1)(col("id")).alias("body"))
    save(again, options)
    assert len(await read_stream(rabbitmq_testbed, rabbitmq_unique_name)) == 600  # the same appId and batchId


async def test_a_streaming_write_is_exactly_once_across_a_task_failure_and_a_batch_replayed_from_its_checkpoint(
    spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    await create_stream(rabbitmq_testbed, rabbitmq_unique_name)
    source = tmp_path / "in"
    source.mkdir()
    now = int(time.time())
    for part in range(3):  # three files, one micro-batch each
        lines = [json.dumps({"id": i, "user": f"user-{i % 7}"}) for i in range(part * 300, part * 300 + 300)]
        path = source / f"part-{part}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (now - 10 + part, now - 10 + part))  # Spark takes files in modification-time order
    marker = tmp_path / "failed-once"
    checkpoint = tmp_path / "checkpoint"

    def start() -> Any:
        from pyspark.sql.functions import col

        rows = spark.readStream.schema("id long, user string").option("maxFilesPerTrigger", 1).json(str(source))
        return (rows.select(col("id"), failing_once(marker, 450)(col("id")).alias("body"))
                .writeStream.format("rabbitmq_stream")
                .options(**through_lb(rabbitmq_testbed, stream=rabbitmq_unique_name, compression="gzip"))
                .option("checkpointLocation", str(checkpoint)).start())

    query = start()
    try:
        await asyncio.to_thread(query.processAllAvailable)
    finally:
        query.stop()
    assert marker.exists()
    assert sorted(m["id"] for m in await read_stream(rabbitmq_testbed, rabbitmq_unique_name)) == list(range(900))
    last = forget_last_commit(checkpoint)
    query = start()
    try:
        await asyncio.to_thread(query.processAllAvailable)
        assert query.lastProgress is not None and query.lastProgress["batchId"] == last  # it did run again
    finally:
        query.stop()
    got = await read_stream(rabbitmq_testbed, rabbitmq_unique_name)
    assert len(got) == 900 and sorted(m["id"] for m in got) == list(range(900))


async def test_a_batch_write_to_a_super_stream_routes_each_row_by_the_java_compatible_hash(
    spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        data = [(i, f"user-{i % 7}", json.dumps({"id": i, "user": f"user-{i % 7}"})) for i in range(140)]
        df = spark.createDataFrame(data, "id long, user string, body string").repartition(2)
        save(df, through_lb(rabbitmq_testbed, superStream=rabbitmq_unique_name, keyColumns="user",
                            orderColumns="id"))
        total = 0
        for partition in partitions:
            got = await read_stream(rabbitmq_testbed, partition)
            total += len(got)
            assert all(hash_partition(m["user"], partitions) == partition for m in got)
            ids = [m["id"] for m in got]
            assert len(set(ids)) == len(ids)
        assert total == 140
    finally:
        async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
            await env.delete_super_stream(rabbitmq_unique_name)


@pytest.mark.parametrize("options, message", [
    ({"stream": "{name}", "subEntrySize": "lots"}, "option subEntrySize='lots': a whole number is needed"),
    ({"stream": "{name}", "colour": "blue"}, "unknown option 'colour'"),
    ({"stream": "{name}", "bodyColumn": "payload"}, "option bodyColumn: no column 'payload'"),
    ({"stream": "sc-no-such-stream-{name}"}, "does not exist"),
])
async def test_bad_options_and_a_missing_stream_are_typed_errors_naming_them(
    spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, options: dict[str, str], message: str
) -> None:
    await create_stream(rabbitmq_testbed, rabbitmq_unique_name)
    df = spark.createDataFrame([(1, "x")], "id long, body string")
    given = {k: v.format(name=rabbitmq_unique_name) for k, v in options.items()}
    with pytest.raises(Exception, match=message) as raised:
        save(df, through_lb(rabbitmq_testbed, **given))
    assert ("ConfigurationError" if "no-such" not in given["stream"] else "StreamNotFound") in str(raised.value)
    assert await read_stream(rabbitmq_testbed, rabbitmq_unique_name) == []  # nothing written


async def test_filter_values_go_with_each_row_so_a_filtering_consumer_gets_only_its_own_chunks(
    spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    from smartclient import StreamFilter

    await create_stream(rabbitmq_testbed, rabbitmq_unique_name)
    options = through_lb(rabbitmq_testbed, stream=rabbitmq_unique_name, appId=rabbitmq_unique_name,
                         filterColumn="region")
    for batch, (region, ids) in enumerate([("eu", range(50)), ("us", range(50, 100)), ("eu", range(100, 101))]):
        rows = [(i, region, json.dumps({"id": i, "region": region})) for i in ids]  # a write's rows: its own chunks
        save(spark.createDataFrame(rows, "id long, region string, body string").coalesce(1),
             {**options, "batchId": str(batch)})
    node = rabbitmq_testbed.nodes[0]
    got: list[dict[str, Any]] = []
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: got.append(json.loads(bytes(m))),
                                      offset="first", filter=StreamFilter(["eu"]))  # the Bloom filter alone
        await wait_until(lambda: any(m["id"] == 100 for m in got), 30, "the last eu row through the filter")
        await consumer.close()
    assert [m["id"] for m in got] == [*range(50), 100]  # no chunk of us rows was delivered
