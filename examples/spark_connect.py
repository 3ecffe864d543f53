"""Spark Connect: read a stream, transform it, write it back exactly once, from a Connect client.

    python examples/spark_connect.py     # the test bed's Connect server (started if need be) and its HAProxy
    SMARTCLIENT_SPARK_CONNECT=sc://spark:15002 SMARTCLIENT_URI=rabbitmq-stream://u:p@lb:5552/ python ...

The client holds no Spark JVM: the query runs on the Connect server (here an application of the test bed's
standalone cluster), whose Python workers import smartclient.  The ``rabbitmq_stream`` format reads ``orders``
(replicas, through the load balancer) and writes ``orders-taxed`` (each task through one producer on the leader,
publishing ids from the query, the batch, the partition and the row); the example then runs the query's last
batch again, as after a crash between writing and committing, and checks that every order is there exactly once.
Ends with ``spark-connect OK: ...`` (exit status 0), else ``spark-connect FAILED: ...``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from resolvers import LoadBalancer
from smartclient import Address, Environment
from smartclient.spark import register_format

DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:20052/"  # the test bed's round-robin HAProxy


def options(uri: str) -> dict[str, str]:
    return {"uri": uri, "loadBalancer": uri.split("@")[-1].split("/")[0]}


def start(spark: Any, uri: str, source: str, target: str, checkpoint: str) -> Any:
    """The query: orders -> the amount with tax -> ``target``, exactly once."""
    from pyspark.sql import functions as F

    register_format(spark)  # pickled here, imported on the server's Python workers: checked first
    orders = spark.readStream.format("rabbitmq_stream").options(**options(uri)).option("streams", source).load()
    order = F.from_json(F.col("body").cast("string"), "id long, customer string, amount double")
    taxed = orders.select(F.to_json(F.struct(
        order.id.alias("id"), order.customer.alias("customer"),
        F.round(order.amount * 1.2, 2).alias("with_tax"))).alias("body"))
    return (taxed.writeStream.format("rabbitmq_stream").options(**options(uri)).option("stream", target)
            .option("checkpointLocation", checkpoint).start())


def run(spark: Any, uri: str, source: str, target: str, checkpoint: str) -> None:
    """Run the query until caught up; then its last batch once more, as a restart after a crash would."""
    for again in (False, True):
        if again:
            commits = Path(checkpoint) / "commits"
            last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
            for name in (str(last), f".{last}.crc"):  # the commit and its checksum
                (commits / name).unlink(missing_ok=True)
        query = start(spark, uri, source, target, checkpoint)
        try:
            query.processAllAvailable()
        finally:
            query.stop()


async def publish_orders(uri: str, stream: str, count: int) -> None:
    async with Environment(uri, resolver=LoadBalancer(Address.parse(options(uri)["loadBalancer"]))) as env:
        await env.create_stream(stream, exists_ok=True)
        if not count:
            return
        producer = await env.producer(stream)
        await producer.send_batch([json.dumps({"id": i, "customer": f"c{i % 11}", "amount": i * 1.5}).encode()
                                   for i in range(count)])


async def read_all(uri: str, stream: str) -> list[dict[str, Any]]:
    """Every message of ``stream``, read to its end."""
    async with Environment(uri, resolver=LoadBalancer(Address.parse(options(uri)["loadBalancer"]))) as env:
        table = await env.read_arrow(stream, decode=True)  # the AMQP 1.0 messages the producers wrote, decoded
        return [json.loads(body) for body in table.column("body").to_pylist()]


def connect_session() -> tuple[Any, Any]:
    """A Connect session, and the server this example started (None when it ran already or was given)."""
    from pyspark.sql import SparkSession

    url = os.environ.get("SMARTCLIENT_SPARK_CONNECT")
    server = None
    if url is None:
        from smartclient.testing.spark_connect import ConnectServer

        server = ConnectServer.from_env()
        url = server.url
        if not server.start():
            server = None  # it ran already: leave it running
    return SparkSession.builder.remote(url).getOrCreate(), server


def check(out: list[dict[str, Any]], count: int) -> tuple[bool, str]:
    ids = sorted(m["id"] for m in out)
    duplicated = len(ids) - len(set(ids))
    missing = count - len(set(ids))
    ok = ids == list(range(count)) and all(m["with_tax"] == round(m["id"] * 1.5 * 1.2, 2) for m in out)
    return ok, f"{len(out)} taxed orders, {missing} missing, {duplicated} duplicated, after a batch run twice"


def main() -> int:
    uri = os.environ.get("SMARTCLIENT_URI", DEFAULT_URI)
    suffix = uuid.uuid4().hex[:6]
    source, target = f"orders-{suffix}", f"orders-taxed-{suffix}"
    asyncio.run(publish_orders(uri, source, 1000))
    asyncio.run(publish_orders(uri, target, 0))
    spark, server = connect_session()
    try:
        with tempfile.TemporaryDirectory() as checkpoint:
            run(spark, uri, source, target, checkpoint)
    finally:
        spark.stop()
        if server is not None:
            server.stop()
    ok, what = check(asyncio.run(read_all(uri, target)), 1000)
    print(f"spark-connect {'OK' if ok else 'FAILED'}: {what}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
