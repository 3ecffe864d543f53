"""The ``rabbitmq_stream`` format's writers on the test bed's standalone cluster: ``df.write`` and
``df.writeStream`` exactly once when a worker is killed (``kill -9`` by PID, with its executor and Python workers)
while its task is part-way through writing its partition, and comes back.  Spark runs the lost task again on an
executor, under the same producer name and publishing ids: the broker drops what the killed task had stored."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from smartclient import Environment
from smartclient.spark import RabbitStreamDataSource
from smartclient.testing import TestBed
from smartclient.testing.pytest_plugin import SparkOnCluster

from ..conftest import wait_until
from .conftest import in_thread, read_stream, stored
from .test_spark_cluster import TaskHold, via_lb

pytestmark = pytest.mark.spark
log = logging.getLogger(__name__)

ROWS = 1200  # two partitions of 600
HOLD_AFTER = 200  # a task's rows reach its writer 100 at a time (Arrow batches): 200 go out, then it holds
# 1 KiB rows: the JVM hands a Python worker its input through a 64 KiB buffer, so a few dozen small rows would wait
# there, unwritten, while the task holds
PAD = "x" * 1000


@dataclass
class HoldMidPartition(TaskHold):
    """A Python UDF that makes row ``id``'s body, once :meth:`TaskHold.count_row` lets the row go."""

    def __call__(self, i: int) -> str:
        self.count_row()
        return json.dumps({"id": i, "pad": PAD})


@pytest.mark.requires_rabbitmq("4.3", reason="it counts the target's messages by StreamStats' committed_offset")
@pytest.mark.parametrize("kind", ["batch", "streaming"])
async def test_a_writer_is_exactly_once_when_a_worker_is_killed_while_its_task_writes(
    kind: str, rabbitmq_spark_cluster: SparkOnCluster, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str,
    tmp_path: Path
) -> None:
    from pyspark.sql.functions import col, udf

    cluster, spark = rabbitmq_spark_cluster.cluster, rabbitmq_spark_cluster.session
    spark.dataSource.register(RabbitStreamDataSource)
    uri, _ = via_lb(rabbitmq_testbed)
    host, port = rabbitmq_testbed.lb("stream")
    target = rabbitmq_unique_name
    async with Environment(uri) as env:
        await env.create_stream(target)
    shared = tmp_path / "tasks"
    shared.mkdir()
    body = udf(HoldMidPartition(str(shared), HOLD_AFTER), "string", useArrow=True)
    options = {"uri": uri, "loadBalancer": f"{host}:{port}", "stream": target, "subEntrySize": "10",
               "keepInputOrder": "true"}  # each Arrow batch written as it comes: the kill finds some written
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    query: Any = None
    if kind == "batch":
        rows = spark.range(0, ROWS, numPartitions=2).select(body(col("id")).alias("body"))
        run = in_thread(spark, lambda: rows.write.format("rabbitmq_stream").mode("append").options(**options)
                        .save())
    else:
        source = tmp_path / "in"
        source.mkdir()
        for part in range(2):  # one micro-batch of two files, each a partition
            ids = range(part * ROWS // 2, (part + 1) * ROWS // 2)
            (source / f"part-{part}.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
        query = (spark.readStream.schema("id long").json(str(source)).select(body(col("id")).alias("body"))
                 .writeStream.format("rabbitmq_stream").options(**options)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        run = in_thread(spark, query.awaitTermination)
    try:
        def held() -> list[Path]:
            if run.done():
                run.result()  # the write failed: say why
                raise AssertionError("the write ended before any task held")
            return sorted(shared.glob("holding-*"))

        holding = (await wait_until(held, 180, "a task to hold part-way through its partition", interval=0.1))[0]
        async def both_wrote() -> int:  # each partition's first Arrow batch at least: the victim's task wrote some
            count = await stored(rabbitmq_testbed, target)
            return count if count >= 2 * 100 else 0

        before = await wait_until(both_wrote, 60, f"both held tasks' first rows in {target}", interval=0.1)
        executor = int(holding.read_text())
        victim = next(i for i in (1, 2) if executor in cluster.executor_pids(i))
        killed = await asyncio.to_thread(cluster.kill_worker, victim)
        assert executor in killed
        log.info("killed Spark worker %d (PIDs %s) with %d of %d rows in %s", victim, killed, before, ROWS, target)
        assert not run.done()  # every task that reaches its row 201 holds until released
        await asyncio.to_thread(cluster.restart_worker, victim)
        await asyncio.to_thread(cluster.wait_executors, spark, 2, 120)
    finally:
        (shared / "release").write_text("go")
    try:
        await asyncio.wait_for(asyncio.shield(run), 300)
        if query is not None:
            assert query.exception() is None
    finally:
        if query is not None:
            query.stop()
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert 0 < before < ROWS  # the kill came part-way through
    ids = [m["id"] for m in await read_stream(rabbitmq_testbed, target)]
    duplicated = len(ids) - len(set(ids))
    assert sorted(ids) == list(range(ROWS)), f"{len(set(range(ROWS)) - set(ids))} missing, {duplicated} duplicated"
    for first in (0, ROWS // 2):  # each partition in its own order
        assert [i for i in ids if first <= i < first + ROWS // 2] == list(range(first, first + ROWS // 2))
