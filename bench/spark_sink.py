"""bench/spark_sink.py: rows per second through the exactly-once Spark sink, beside the raw producer.

One batch of 200k rows (100-byte bodies, 4 slots) goes through ExactlyOnceSink on local[2]; in the
same run, the raw anchor (rstream's send_batch of 1000 from one process, confirms awaited) publishes
the same number of messages.  The sink's rate is divided by the 2 cores it had.

Target (issue 5): the sink at least 0.5x the raw producer per core.
Run from the repository root with the test bed up (./dev demo): python bench/spark_sink.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

from resolvers import LoadBalancer
from smartclient import Address
from smartclient.spark import ExactlyOnceSink, StreamConnection
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

ROWS = 200_000
CORES = int(os.environ.get("SPARK_BENCH_CORES", "1"))
TARGET = 0.5


async def raw_rate(bed: LocalTestBed, stream: str) -> float:
    from publish import rstream_send_batch  # bench/ is on sys.path when run as python bench/spark_sink.py

    return await rstream_send_batch(bed, stream, ROWS)


def sink_rate(bed: LocalTestBed, stream: str) -> float:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{CORES}]").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = spark.range(ROWS).select(F.col("id"), (F.col("id") % 97).alias("key"),
                                      F.lpad(F.col("id").cast("string"), 100, "x").alias("body")).cache()
        df.count()
        host, port = bed.lb("stream")
        sink = ExactlyOnceSink(StreamConnection(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port))),
                               app_id=stream, stream=stream, key_columns=["key"], order_columns=["id"], slots=4)
        sink(df.limit(1000), 0)  # warm the Python workers and their connections
        started = time.perf_counter()
        sink(df, 1)
        return ROWS / (time.perf_counter() - started)
    finally:
        spark.stop()


def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    raw_stream, sink_stream = (f"bench-spark-{k}-{uuid.uuid4().hex[:6]}" for k in ("raw", "sink"))
    for stream in (raw_stream, sink_stream):
        asyncio.run(create_stream_led_by(bed, stream, 0))
    try:
        raw = asyncio.run(raw_rate(bed, raw_stream))
        sink = sink_rate(bed, sink_stream)
    finally:
        asyncio.run(delete_streams(bed, raw_stream, sink_stream))
    per_core = sink / CORES
    ratio = per_core / raw
    print(f"raw producer (rstream send_batch(1000), 1 process): {raw / 1000:7.1f}k msg/s")
    print(f"ExactlyOnceSink on local[{CORES}]:                    {sink / 1000:7.1f}k rows/s "
          f"({per_core / 1000:.1f}k per core)")
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"spark_sink: per_core_ratio={ratio:.2f} target >= {TARGET} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
