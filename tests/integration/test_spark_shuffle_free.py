"""The sink's shuffle-free mode (``partitioning="input"``) against the real cluster: a stream source's
offset ranges written in their own order, a super stream routed by the Java-compatible hash, and the
refusal of plans whose partitions a replay could change."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from smartclient import ConfigurationError, Environment, hash_partition
from smartclient.spark import ExactlyOnceSink
from smartclient.testing import TestBed

from .conftest import read_stream
from .test_spark import connection_via_lb, fill, rows, source

pytestmark = pytest.mark.spark


def input_sink(bed: TestBed, app_id: str, **target: Any) -> ExactlyOnceSink:
    return ExactlyOnceSink(connection_via_lb(bed), app_id=app_id, partitioning="input", **target)


async def test_a_stream_source_goes_through_without_a_shuffle_each_range_in_order_once(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    source_stream, target = f"{rabbitmq_unique_name}-in", f"{rabbitmq_unique_name}-out"
    await fill(rabbitmq_testbed, source_stream, 0, 1000)
    async with Environment(rabbitmq_testbed.stream_uri(rabbitmq_testbed.nodes[0].host,
                                                       rabbitmq_testbed.nodes[0].stream_port)) as env:
        await env.create_stream(target)
    sink = input_sink(rabbitmq_testbed, rabbitmq_unique_name, stream=target)
    seen_plans: list[str] = []

    def write(df: Any, batch_id: int) -> None:
        seen_plans.append(str(df._jdf.queryExecution().executedPlan().toString()))
        sink(df, batch_id)
        if batch_id == 0:
            sink(df, batch_id)  # a replayed batch: the same partitions, the same ids, nothing new

    frame = (source(rabbitmq_spark, rabbitmq_testbed, source_stream, streaming=True)
             .option("maxRecordsPerPartition", "150").load()
             .select(F.to_json(F.struct((F.col("offset") * 10).alias("id"))).alias("body")))

    def run() -> None:
        query = (frame.writeStream.foreachBatch(write)
                 .option("checkpointLocation", str(tmp_path / "cp")).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    await asyncio.to_thread(run)
    assert seen_plans and not any("Exchange" in plan for plan in seen_plans)
    ids = [m["id"] for m in await read_stream(rabbitmq_testbed, target)]
    # 7 offset ranges of at most 150, each written by its own producer in its own order: each range's
    # ids in order, every id once
    assert sorted(ids) == [offset * 10 for offset in range(1000)]
    for first in range(0, 1000, 150):
        in_range = [i for i in ids if first * 10 <= i < (first + 150) * 10]
        assert in_range == sorted(in_range), first


async def test_a_super_stream_in_the_input_mode_is_routed_by_the_java_compatible_hash(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        partitions = await env.create_super_stream(rabbitmq_unique_name, partitions=3)
    try:
        sink = input_sink(rabbitmq_testbed, rabbitmq_unique_name, super_stream=rabbitmq_unique_name,
                          key_columns=["user"])
        batch = rows(rabbitmq_spark, 0, 140).select("user", "body")  # local data in 2 partitions
        await asyncio.to_thread(sink, batch, 0)
        await asyncio.to_thread(sink, batch, 0)  # replayed: nothing new
        total = 0
        for partition in partitions:
            got = await read_stream(rabbitmq_testbed, partition)
            total += len(got)
            assert all(hash_partition(m["user"], partitions) == partition for m in got)
        assert total == 140
    finally:
        async with Environment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
            await env.delete_super_stream(rabbitmq_unique_name)


async def test_the_input_mode_refuses_a_shuffle_and_a_non_deterministic_expression(
    rabbitmq_spark: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    from pyspark.sql import functions as F

    sink = input_sink(rabbitmq_testbed, rabbitmq_unique_name, stream=rabbitmq_unique_name)
    df = rows(rabbitmq_spark, 0, 20)
    refused = {
        "an aggregation": df.groupBy("user").agg(F.max("body").alias("body")),
        "a repartition": df.repartition(3),
        "a global sort": df.orderBy("id"),
        "dropDuplicates": df.dropDuplicates(["user"]),
        "a global limit": df.limit(5),
    }
    for what, batch in refused.items():
        with pytest.raises(ConfigurationError, match="without a shuffle"):
            await asyncio.to_thread(sink, batch, 0)
        print(f"refused {what}")
    for batch in (df.withColumn("r", F.rand()), df.withColumn("m", F.monotonically_increasing_id())):
        with pytest.raises(ConfigurationError, match="non-deterministic"):
            await asyncio.to_thread(sink, batch, 0)
    # filters, projections, coalesce and broadcast joins keep each row in its partition
    users = rabbitmq_spark.createDataFrame([(f"user-{i}", i) for i in range(7)], "user string, n int")
    kept = df.where(F.col("id") % 2 == 0).coalesce(1).join(F.broadcast(users), "user").select("body")
    async with Environment(rabbitmq_testbed.stream_uri(rabbitmq_testbed.nodes[0].host,
                                                       rabbitmq_testbed.nodes[0].stream_port)) as env:
        await env.create_stream(rabbitmq_unique_name)
    await asyncio.to_thread(sink, kept, 0)
    assert sorted(m["id"] for m in await read_stream(rabbitmq_testbed, rabbitmq_unique_name)) == list(range(0, 20, 2))
