"""Spark Connect: the ``rabbitmq_stream`` reader, both writers and the ``foreachBatch`` sink from a Connect client
(``SparkSession.builder.remote``), against a Connect server that runs on the test bed's standalone cluster
(``rabbitmq_spark_connect``), every connection through the load balancer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from smartclient import ConfigurationError, Environment
from smartclient.spark import ExactlyOnceSink, RabbitStreamDataSource, register_format
from smartclient.spark.config import StreamConnection
from smartclient.testing import TestBed

from .conftest import forget_last_commit, load_example, read_stream

pytestmark = pytest.mark.spark


def lb_options(bed: TestBed) -> dict[str, str]:
    host, port = bed.lb("stream")
    return {"uri": bed.stream_uri(host, port), "loadBalancer": f"{host}:{port}"}


@pytest.fixture
def connect(rabbitmq_spark_connect: Any) -> Any:
    register_format(rabbitmq_spark_connect)  # checked: the server's Python imports smartclient
    return rabbitmq_spark_connect


async def filled(bed: TestBed, name: str, count: int) -> None:
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        await env.create_stream(name)
        if not count:
            return
        producer = await env.producer(name)
        await producer.send_batch([json.dumps({"id": i, "user": f"user-{i % 5}"}).encode() for i in range(count)])


async def test_the_session_is_a_connect_client(connect: Any) -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    assert isinstance(connect, ConnectSession)
    assert connect.range(3).count() == 3


async def test_a_batch_read_and_write_through_connect(
    connect: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    source, target = f"{rabbitmq_unique_name}-in", f"{rabbitmq_unique_name}-out"
    await filled(rabbitmq_testbed, source, 300)
    await filled(rabbitmq_testbed, target, 0)
    rows = (connect.read.format("rabbitmq_stream").options(**lb_options(rabbitmq_testbed))
            .option("streams", source).load())
    assert rows.count() == 300
    options = {**lb_options(rabbitmq_testbed), "stream": target, "appId": rabbitmq_unique_name, "batchId": "1"}
    for _ in range(2):  # the same batch twice: written once
        await asyncio.to_thread(rows.select("body").write.format("rabbitmq_stream").mode("append")
                                .options(**options).save)
    got = await read_stream(rabbitmq_testbed, target)
    assert sorted(m["id"] for m in got) == list(range(300))


async def test_a_foreach_batch_sink_through_connect_is_exactly_once_across_a_replayed_batch(
    connect: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    """The function runs in a Python process beside the server: the sink carries all it needs.  (The format's
    stream writer through Connect, with a replayed batch: the example's test, below.)"""
    source, target = f"{rabbitmq_unique_name}-in", f"{rabbitmq_unique_name}-out"
    await filled(rabbitmq_testbed, source, 500)
    await filled(rabbitmq_testbed, target, 0)
    checkpoint = tmp_path / "checkpoint"
    lb = lb_options(rabbitmq_testbed)

    def start() -> Any:
        rows = connect.readStream.format("rabbitmq_stream").options(**lb).option("streams", source).load()
        from resolvers import LoadBalancer

        host, port = rabbitmq_testbed.lb("stream")
        sink = ExactlyOnceSink(StreamConnection(lb["uri"], resolver=LoadBalancer(f"{host}:{port}")),
                               app_id=rabbitmq_unique_name, stream=target, partitioning="input")
        return (rows.select("offset", "body").writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(checkpoint)).start())

    query = start()
    try:
        await asyncio.to_thread(query.processAllAvailable)
    finally:
        query.stop()
    forget_last_commit(checkpoint)
    query = start()
    try:
        await asyncio.to_thread(query.processAllAvailable)
    finally:
        query.stop()
    got = await read_stream(rabbitmq_testbed, target)
    assert len(got) == 500 and sorted(m["id"] for m in got) == list(range(500))


async def test_the_connect_example_reads_transforms_and_writes_back_exactly_once(
    connect: Any, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    """``examples/spark_connect.py``'s steps, on this session (its main starts the same server when it is down)."""
    example = load_example("spark_connect")
    host, port = rabbitmq_testbed.lb("stream")
    uri = rabbitmq_testbed.stream_uri(host, port)
    source, target = f"{rabbitmq_unique_name}-in", f"{rabbitmq_unique_name}-out"
    await example.publish_orders(uri, source, 400)
    await example.publish_orders(uri, target, 0)
    await asyncio.to_thread(example.run, connect, uri, source, target, str(tmp_path / "checkpoint"))
    ok, what = example.check(await example.read_all(uri, target), 400)
    assert ok, what
    assert what.startswith("400 taxed orders, 0 missing, 0 duplicated")


async def test_a_connect_server_whose_python_lacks_smartclient_is_a_typed_error(rabbitmq_spark_connect: Any) -> None:
    """A second server, local[1], whose Python workers run the system's Python (no smartclient): registering the
    format there says so, naming what to install, before any query."""
    from smartclient.testing.spark_connect import ConnectServer

    cluster = ConnectServer.from_env().cluster
    bare = ConnectServer(cluster, python="/usr/bin/python3", name="connect-bare", port=cluster.port_base + 51,
                         master="local[1]")
    await asyncio.to_thread(bare.start)
    try:
        session = bare.session(new=True)
        try:
            with pytest.raises(ConfigurationError, match="Python workers cannot import smartclient.*install "
                                                         r"smartclient\[spark\]"):
                register_format(session)
            assert RabbitStreamDataSource.name() == "rabbitmq_stream"
        finally:
            session.stop()
    finally:
        await asyncio.to_thread(bare.stop)
