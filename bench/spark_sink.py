"""bench/spark_sink.py: the exactly-once Spark sink against Spark's own floor, in both of its modes.

In one run, on ``local[CORES]`` (``SPARK_BENCH_CORES``, default 1) and 200k rows of 100-byte bodies:

* **raw**: rstream's ``send_batch(1000)`` from one process, every confirm awaited (the anchor of issue 5);
* for each partitioning of ``ExactlyOnceSink`` (``partitioning="slots"``, 4 slots: slot column, repartition
  by slot, sort; ``partitioning="input"``: none of that), alternating over ``ROUNDS`` rounds:
  * **floor**: a no-op ``foreachBatch`` that does exactly the sink's Spark-side work
    (``ExactlyOnceSink.prepare``, then the same ``mapInArrow`` hand-off of Arrow batches to Python) and
    publishes nothing;
  * **sink**: the sink itself, publishing through the test bed's round-robin load balancer; in the slots
    partitioning twice, in its default setting (sub-entries of up to 100 rows, which the brokers store and
    confirm once per group) and with one entry per row (``sub_entry_size=1``, the default before issue 33).

* for the ``rabbitmq_stream`` format's batch writer (``df.write.format("rabbitmq_stream")``, issue 56), in its
  default setting (each partition sorted by every column) and with ``keepInputOrder=true``, alternating likewise:
  * **floor**: a Python data source of the same Arrow writer kind that takes the same rows and partitions and
    writes nothing (``df.write.format("bench_null")``);
  * **writer**: the format, publishing through the load balancer.

Each sink's ratio is the median of its rounds' own ratios to the floor measured just before it.  The verdict
is on the sink over its floor in the slots partitioning in its default setting (target >= 0.8, issue 33), on
the shuffle-free mode (its default setting) per Spark core over the raw producer (target >= 0.5), and on the
format's writer over its floor in its default setting (target >= 0.8, issue 56).  For the format it also prints
the CPU time every process and the RabbitMQ nodes alone spent on its rounds, and the ceiling that leaves the writer:
the floor keeps every core of a small machine busy, so the brokers' CPU for storing and replicating the rows adds
to the writer's time whatever the writer does (``floor CPU / (floor CPU + brokers' CPU)``).
Run from the repository root with the test bed up (./dev demo): python bench/spark_sink.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from resolvers import LoadBalancer
from smartclient import Address
from smartclient.spark import ExactlyOnceSink, StreamConnection
from smartclient.testing.local import LocalTestBed
from smartclient.testing.processes import cpu_by_process
from smartclient.testing.streams import create_stream_led_by, delete_streams

ROWS = 200_000
CORES = int(os.environ.get("SPARK_BENCH_CORES", "1"))
ROUNDS = int(os.environ.get("SPARK_BENCH_ROUNDS", "3"))
FLOOR_TARGET = 0.8
INPUT_TARGET = 0.5


async def raw_rate(bed: LocalTestBed, stream: str) -> float:
    from publish import rstream_send_batch  # bench/ is on sys.path when run as python bench/spark_sink.py

    return await rstream_send_batch(bed, stream, ROWS)


def count_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """The floor's writer: the Arrow batches reach Python, and nothing is published."""
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"written": [sum(batch.num_rows for batch in batches)]})


def floor(sink: ExactlyOnceSink, df: Any, batch_id: int) -> None:
    prepared, _ = sink.prepare(df, batch_id)
    prepared.mapInArrow(count_rows, "written long").groupBy().sum("written").collect()


def null_source() -> Any:
    """The format's floor: a Python data source whose Arrow writer takes every batch and writes nothing."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Nothing(DataSourceArrowWriter):  # type: ignore[misc]
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            sum(batch.num_rows for batch in iterator)
            return WriterCommitMessage()

    class NullSource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "bench_null"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return Nothing()

    return NullSource


def write_format(df: Any, name: str, options: dict[str, str]) -> None:
    df.write.format(name).mode("append").options(**options).save()


def timed(work: Any, *args: Any) -> float:
    started = time.perf_counter()
    work(*args)
    return ROWS / (time.perf_counter() - started)


def cpu_seconds(brokers_only: bool) -> float:
    """The CPU time (user and system) of every process of this machine, or of its RabbitMQ nodes alone."""
    return sum(spent for _, spent in cpu_by_process({"beam": "beam.smp"} if brokers_only else {"all": ""}).values())


def timed_cpu(cpu: dict[str, list[float]], work: Any, *args: Any) -> float:
    """:func:`timed`, adding to ``cpu`` the CPU seconds every process and the brokers spent on it."""
    everything, brokers = cpu_seconds(False), cpu_seconds(True)
    rate = timed(work, *args)
    cpu["all"].append(cpu_seconds(False) - everything)
    cpu["brokers"].append(cpu_seconds(True) - brokers)
    return rate


DEFAULT = "slots (default)"
MODES = {DEFAULT: "slots", "slots, one entry per row": "slots", "input (default)": "input"}  # -> its floor
FORMAT = "format (default)"
FORMATS = {FORMAT: {}, "format, keepInputOrder": {"keepInputOrder": "true"}}


def spark_rates(bed: LocalTestBed, streams: dict[str, str],
                cpu: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, list[float]]]:
    from pyspark.sql import functions as F

    from smartclient.spark.session import local_session

    spark = local_session(f"local[{CORES}]", "bench-spark-sink", spark_driver_memory="2g")
    rates: dict[str, dict[str, list[float]]] = {mode: {"floor": [], "sink": []} for mode in streams}
    from smartclient.spark import RabbitStreamDataSource

    spark.dataSource.register(RabbitStreamDataSource)
    spark.dataSource.register(null_source())
    try:
        def frame(count: int) -> Any:
            return spark.range(count).select(F.col("id"), (F.col("id") % 97).alias("key"),
                                             F.lpad(F.col("id").cast("string"), 100, "x").alias("body"))

        df = frame(ROWS).cache()
        df.count()
        warm = frame(1000).cache()
        warm.count()
        host, port = bed.lb("stream")
        connection = StreamConnection(bed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port)))
        slotted = {"key_columns": ["key"], "order_columns": ["id"], "slots": 4}
        sinks = {mode: ExactlyOnceSink(connection, app_id=streams[mode], stream=streams[mode],
                                       **(slotted if MODES[mode] == "slots" else {"partitioning": "input"}),
                                       **({"sub_entry_size": 1} if "one entry per row" in mode else {}))
                 for mode in MODES}
        formats = {mode: {"uri": connection.uri, "loadBalancer": f"{host}:{port}", "stream": streams[mode],
                          "appId": streams[mode], **extra} for mode, extra in FORMATS.items()}
        for sink in sinks.values():  # warm the Python workers, their connections and the producers
            sink(warm, 0)
            floor(sink, warm, 0)
        for options in formats.values():
            write_format(warm, "rabbitmq_stream", options)
            write_format(warm, "bench_null", {})
        for round_ in range(ROUNDS):
            for mode, sink in sinks.items():
                rates[mode]["floor"].append(timed(floor, sink, df, round_ + 1))
                rates[mode]["sink"].append(timed(sink, df, round_ + 1))
                print(f"  round {round_ + 1} {mode:27}: floor {rates[mode]['floor'][-1] / 1000:6.1f}k rows/s, "
                      f"sink {rates[mode]['sink'][-1] / 1000:6.1f}k rows/s", flush=True)
            for mode, options in formats.items():
                rates[mode]["floor"].append(timed_cpu(cpu["floor"], write_format, df, "bench_null", {}))
                rates[mode]["sink"].append(timed_cpu(cpu["writer"], write_format, df, "rabbitmq_stream",
                                                     {**options, "batchId": str(round_ + 1)}))
                print(f"  round {round_ + 1} {mode:27}: floor {rates[mode]['floor'][-1] / 1000:6.1f}k rows/s, "
                      f"writer {rates[mode]['sink'][-1] / 1000:6.1f}k rows/s", flush=True)
    finally:
        spark.stop()
    return rates


def main() -> int:
    bed = LocalTestBed.from_env()
    bed.up()
    tag = uuid.uuid4().hex[:6]
    raw_stream = f"bench-spark-raw-{tag}"
    streams = {mode: f"bench-spark-{index}-{tag}" for index, mode in enumerate([*MODES, *FORMATS])}
    for stream in (raw_stream, *streams.values()):
        asyncio.run(create_stream_led_by(bed, stream, 0))
    try:
        raw = statistics.median(asyncio.run(raw_rate(bed, raw_stream)) for _ in range(2))
        cpu: dict[str, dict[str, list[float]]] = {kind: {"all": [], "brokers": []} for kind in ("floor", "writer")}
        rates = spark_rates(bed, streams, cpu)
    finally:
        asyncio.run(delete_streams(bed, raw_stream, *streams.values()))
    print(f"raw producer (rstream send_batch(1000), 1 process): {raw / 1000:7.1f}k msg/s")
    verdict = {}
    for mode in streams:
        floor_rate, sink_rate = (statistics.median(rates[mode][k]) for k in ("floor", "sink"))
        per_core = sink_rate / CORES
        of_floor = statistics.median(s / f for s, f in zip(rates[mode]["sink"], rates[mode]["floor"], strict=True))
        verdict[mode] = (of_floor, per_core / raw)
        print(f"{mode:27} on local[{CORES}]: floor {floor_rate / 1000:7.1f}k rows/s, "
              f"sink {sink_rate / 1000:7.1f}k rows/s ({per_core / 1000:.1f}k per core): "
              f"{verdict[mode][0]:.2f}x the floor, {verdict[mode][1]:.2f}x raw per core")
    # what the machine allows: the floor keeps every core busy, so the CPU the brokers spend storing and
    # replicating the same rows adds to the writer's time whatever the writer does
    floor_cpu, writer_cpu, brokers = (statistics.median(cpu[kind][part]) for kind, part in (
        ("floor", "all"), ("writer", "all"), ("writer", "brokers")))
    print(f"format rounds' CPU (every process, median): floor {floor_cpu * 1000:.0f} ms; writer "
          f"{writer_cpu * 1000:.0f} ms, of which the brokers {brokers * 1000:.0f} ms and the rest of it "
          f"{(writer_cpu - brokers - floor_cpu) * 1000:+.0f} ms over the floor's; the ceiling the brokers' share "
          f"leaves the writer on this machine: {floor_cpu / (floor_cpu + brokers):.2f} of the floor")
    floor_ratio, input_ratio, format_ratio = verdict[DEFAULT][0], verdict["input (default)"][1], verdict[FORMAT][0]
    ok = floor_ratio >= FLOOR_TARGET and input_ratio >= INPUT_TARGET and format_ratio >= FLOOR_TARGET
    print(f"spark_sink: floor_ratio={floor_ratio:.2f} target >= {FLOOR_TARGET} and "
          f"input_per_core_ratio={input_ratio:.2f} target >= {INPUT_TARGET} and "
          f"format_floor_ratio={format_ratio:.2f} target >= {FLOOR_TARGET} {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
