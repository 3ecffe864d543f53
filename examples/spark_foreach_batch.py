"""Spark pipeline: read a stream, transform it, write it to another stream exactly once, all through the LB.

    python examples/spark_foreach_batch.py        # against the local test bed's round-robin HAProxy

The source reads ``orders`` from replicas; the transform computes an amount with tax per order; the
sink writes to ``orders-taxed`` through :class:`ExactlyOnceSink` (one producer per slot, publishing
ids derived from the batch), so a replayed batch adds nothing.  Exit status 0 when the output holds
every order exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from resolvers import LoadBalancer
from smartclient import Address, Environment
from smartclient.spark import ExactlyOnceSink, RabbitStreamDataSource, StreamConnection, local_session

DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:20052/"  # the test bed's round-robin HAProxy


def run(spark: Any, uri: str, source: str, target: str, app_id: str, checkpoint: str, *,
        to_message: Callable[[Any], Any] | None = None) -> None:
    """The pipeline itself: stream source -> transform -> exactly-once stream sink; until caught up.
    ``to_message(row) -> bytes`` replaces the sink's default (the ``body`` column as it is)."""
    from pyspark.sql import functions as F

    lb = Address.parse(uri.split("@")[-1].split("/")[0])
    asyncio.run(ensure_stream(uri, target))
    spark.dataSource.register(RabbitStreamDataSource)
    orders = (spark.readStream.format("rabbitmq_stream").option("uri", uri)
              .option("loadBalancer", str(lb)).option("streams", source).load())
    parsed = orders.select(F.col("offset"), F.from_json(F.col("body").cast("string"),
                                                      "id long, customer string, amount double").alias("o"))
    taxed = parsed.select(
        F.col("offset"), F.col("o.customer").alias("customer"),
        F.to_json(F.struct(F.col("o.id").alias("id"), F.col("o.customer").alias("customer"),
                           F.round(F.col("o.amount") * 1.2, 2).alias("with_tax"))).alias("body"),
    )
    sink = ExactlyOnceSink(StreamConnection(uri, resolver=LoadBalancer(lb)), app_id=app_id, stream=target,
                           key_columns=["customer"], order_columns=["offset"], slots=3, to_message=to_message)
    query = taxed.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


async def ensure_stream(uri: str, stream: str) -> None:
    lb = Address.parse(uri.split("@")[-1].split("/")[0])
    async with Environment(uri, resolver=LoadBalancer(lb)) as env:
        await env.create_stream(stream, exists_ok=True)


async def publish_orders(uri: str, stream: str, count: int) -> None:
    lb = Address.parse(uri.split("@")[-1].split("/")[0])
    async with Environment(uri, resolver=LoadBalancer(lb)) as env:
        await env.create_stream(stream, exists_ok=True)
        producer = await env.producer(stream)
        await producer.send_batch([json.dumps({"id": i, "customer": f"c{i % 11}", "amount": i * 1.5}).encode()
                                   for i in range(count)])


async def read_all(uri: str, stream: str, expect: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    lb = Address.parse(uri.split("@")[-1].split("/")[0])
    got: list[dict[str, Any]] = []
    async with Environment(uri, resolver=LoadBalancer(lb)) as env:
        consumer = await env.consumer(stream, lambda m, c: got.append(json.loads(bytes(m))), offset="first")
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await consumer.close()
    return got


def main() -> int:
    uri = os.environ.get("SMARTCLIENT_URI", DEFAULT_URI)
    suffix = uuid.uuid4().hex[:6]
    source, target = f"orders-{suffix}", f"orders-taxed-{suffix}"
    spark = local_session()
    try:
        asyncio.run(publish_orders(uri, source, 1000))
        with tempfile.TemporaryDirectory() as checkpoint:
            run(spark, uri, source, target, app_id=f"taxes-{suffix}", checkpoint=checkpoint)
        out = asyncio.run(read_all(uri, target, expect=1000))
    finally:
        spark.stop()
    ids = sorted(m["id"] for m in out)
    ok = ids == list(range(1000))
    print(f"{len(out)} taxed orders in {target}; every order exactly once: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
