"""Spark on the test bed's standalone cluster (a master and two workers, each its own JVM): jobs spread over
both executors, and the end-to-end pipeline of ``examples/spark_foreach_batch.py`` (stream source -> transform ->
``ExactlyOnceSink``, all through the round-robin LB) keeps every order exactly once when a worker is killed
(``kill -9`` by PID, with its executor) in the middle of a batch and comes back.  The ``rabbitmq_spark_cluster``
fixture gives the cluster and a session on it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from resolvers import LoadBalancer
from smartclient import Address, Environment
from smartclient.testing import TestBed
from smartclient.testing.pytest_plugin import SparkOnCluster
from smartclient.testing.spark_cluster import EXECUTOR_CLASS

from ..conftest import wait_until
from .conftest import load_example, read_stream, stored

pytestmark = pytest.mark.spark
log = logging.getLogger(__name__)

ORDERS = 3000  # 11 customers hashed into 3 slots: each slot a task of a few hundred rows or more
MORE_ORDERS = 400
HOLD_AFTER = 200  # a task publishes this many rows (two Arrow batches of 100), then holds
HOLD_TIMEOUT = 240.0  # a task the test never lets go fails, rather than hang the query


def executor_jvm() -> int:
    """In a task: the PID of the executor JVM this Python worker runs under (its nearest such ancestor)."""
    pid = os.getpid()
    while pid > 1:
        if EXECUTOR_CLASS.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])
    raise RuntimeError(f"process {os.getpid()} does not run under a Spark executor")


def executor_of_barrier_task(rows: Any) -> Any:
    from pyspark import BarrierTaskContext

    BarrierTaskContext.get().barrier()  # every task of the stage runs at this moment
    yield executor_jvm()


@dataclass
class TaskHold:
    """Counts a task's rows; its row ``after + 1`` first writes ``holding-<pid>`` (its executor JVM's PID inside)
    in ``shared``, then waits there until the file ``release`` exists."""

    shared: str
    after: int
    seen: list[int] = field(default_factory=lambda: [0])  # per task: each task unpickles its own copy

    def count_row(self) -> None:
        self.seen[0] += 1
        if self.seen[0] == self.after + 1:
            shared = Path(self.shared)
            (shared / f"holding-{os.getpid()}").write_text(str(executor_jvm()))
            deadline = time.monotonic() + HOLD_TIMEOUT
            while not (shared / "release").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nobody released the task held in {shared} within {HOLD_TIMEOUT:g} s")
                time.sleep(0.05)


@dataclass
class HoldMidBatch(TaskHold):
    """The sink's ``to_message``: the body as it is, once :meth:`TaskHold.count_row` lets the row go (the task
    holds once ``after`` rows went out, in whole Arrow batches)."""

    def __call__(self, row: Any) -> bytes:
        self.count_row()
        body: str = row["body"]
        return body.encode()


def test_a_master_and_two_workers_run_as_separate_processes_and_a_job_uses_both_executors(
    rabbitmq_spark_cluster: SparkOnCluster,
) -> None:
    cluster, spark = rabbitmq_spark_cluster.cluster, rabbitmq_spark_cluster.session
    assert spark.sparkContext.master == cluster.master_url == f"spark://127.0.0.1:{cluster.master_port}"
    master, workers = cluster.master_pid(), cluster.workers()
    daemons = [master, *(w.pid for w in workers)]
    assert None not in daemons and len(set(daemons)) == 3 and os.getpid() not in daemons
    assert b"org.apache.spark.deploy.master.Master" in Path(f"/proc/{master}/cmdline").read_bytes()
    for worker in workers:
        assert b"org.apache.spark.deploy.worker.Worker" in Path(f"/proc/{worker.pid}/cmdline").read_bytes()
    assert len({w.id for w in workers}) == 2 and all(w.id for w in workers)
    executors = [cluster.executor_pids(i) for i in (1, 2)]
    assert [len(e) for e in executors] == [1, 1], executors  # one executor JVM under each worker
    assert not {*executors[0], *executors[1]} & {os.getpid(), *daemons}

    # a barrier stage of 2 tasks needs both executors' single cores at once
    ran = spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(executor_of_barrier_task).collect()
    assert sorted(ran) == sorted([executors[0][0], executors[1][0]])


def via_lb(bed: TestBed) -> tuple[str, LoadBalancer]:
    host, port = bed.lb("stream")
    return bed.stream_uri(host, port), LoadBalancer(Address(host, port))


async def publish_orders(bed: TestBed, stream: str, ids: range) -> None:
    """Orders as ``examples/spark_foreach_batch.py`` publishes them, with the ids given."""
    uri, resolver = via_lb(bed)
    async with Environment(uri, resolver=resolver) as env:
        await env.create_stream(stream, exists_ok=True)
        producer = await env.producer(stream)
        await producer.send_batch([json.dumps({"id": i, "customer": f"c{i % 11}", "amount": i * 1.5}).encode()
                                   for i in ids])
        await producer.close()


def check_exactly_once(out: list[dict[str, Any]], ids: range) -> None:
    got = sorted(m["id"] for m in out)
    missing, duplicated = set(ids) - set(got), len(got) - len(set(got))
    assert not missing and not duplicated and got == list(ids), (
        f"{len(missing)} missing (e.g. {sorted(missing)[:5]}), {duplicated} duplicated, {len(got)} in all")
    assert all(m["with_tax"] == round(m["id"] * 1.5 * 1.2, 2) for m in out)
    by_customer: dict[str, list[int]] = defaultdict(list)
    for m in out:
        by_customer[m["customer"]].append(m["id"])
    for customer, seq in by_customer.items():
        assert seq == sorted(seq), customer  # a slot's order survives the replay


async def finish(run: asyncio.Future[None], spark: Any, timeout: float, what: str) -> None:
    """Wait for the pipeline's thread; past ``timeout``, stop its query (which ends the thread) and fail."""
    try:
        await asyncio.wait_for(asyncio.shield(run), timeout)
    except asyncio.TimeoutError:
        for query in spark.streams.active:
            query.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, 60)
        pytest.fail(f"{what} did not catch up within {timeout:g} s", pytrace=False)


@pytest.mark.requires_rabbitmq("4.3", reason="it counts the target's messages by StreamStats' committed_offset")
async def test_the_pipeline_on_the_cluster_is_exactly_once_when_a_worker_is_killed_mid_batch(
    rabbitmq_spark_cluster: SparkOnCluster, rabbitmq_testbed: TestBed, rabbitmq_unique_name: str, tmp_path: Path
) -> None:
    cluster, spark = rabbitmq_spark_cluster.cluster, rabbitmq_spark_cluster.session
    pipeline = load_example("spark_foreach_batch")
    uri, _ = via_lb(rabbitmq_testbed)
    source, target = f"{rabbitmq_unique_name}-in", f"{rabbitmq_unique_name}-out"
    checkpoint = str(tmp_path / "checkpoint")
    shared = tmp_path / "tasks"
    shared.mkdir()
    await publish_orders(rabbitmq_testbed, source, range(ORDERS))
    # small Arrow batches: a task publishes its rows a hundred at a time, so it can hold with some out
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    run = asyncio.ensure_future(asyncio.to_thread(
        pipeline.run, spark, uri, source, target, rabbitmq_unique_name, checkpoint,
        to_message=HoldMidBatch(str(shared), HOLD_AFTER)))
    try:
        def held() -> list[Path]:
            if run.done():
                run.result()  # the query failed: say why
                raise AssertionError("the pipeline caught up before any task held")
            return sorted(shared.glob("holding-*"))

        holding = (await wait_until(held, 180, "a task of the first batch to hold", interval=0.1))[0]
        before = await wait_until(lambda: stored(rabbitmq_testbed, target), 60,
                                  f"the held batch's first rows in {target}", interval=0.1)
        executor = int(holding.read_text())
        victim = next(i for i in (1, 2) if executor in cluster.executor_pids(i))
        worker = cluster.worker_pid(victim)
        killed_at = time.monotonic()
        killed = await asyncio.to_thread(cluster.kill_worker, victim)
        assert killed[0] == worker and executor in killed
        log.info("killed Spark worker %d (PIDs %s) with %d of %d rows in %s and %d task(s) held", victim, killed,
                 before, ORDERS, target, len(list(shared.glob("holding-*"))))
        assert cluster.worker_pid(victim) is None and not cluster.executor_pids(victim)
        assert not run.done()  # the batch cannot end: every task that reaches its row 201 holds until released
        await asyncio.to_thread(cluster.restart_worker, victim)
        await asyncio.to_thread(cluster.wait_executors, spark, 2, 120)  # a new executor on the new worker
        log.info("worker %d back with a new executor %.1f s after the kill", victim, time.monotonic() - killed_at)
        assert len(cluster.executor_pids(victim)) == 1 and executor not in cluster.executor_pids(victim)
    except BaseException:
        for query in spark.streams.active:  # leave the session as the next test needs it
            query.stop()
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        raise
    finally:
        (shared / "release").write_text("go")
    released_at = time.monotonic()
    await finish(run, spark, 300, "the pipeline after the worker's kill")
    log.info("the batch ended %.1f s after its held tasks were let go", time.monotonic() - released_at)
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert 0 < before < ORDERS  # the kill came mid-batch
    check_exactly_once(await read_stream(rabbitmq_testbed, target), range(ORDERS))

    # the same query again from its checkpoint: nothing new
    await finish(asyncio.ensure_future(asyncio.to_thread(
        pipeline.run, spark, uri, source, target, rabbitmq_unique_name, checkpoint)), spark, 120, "the rerun")
    check_exactly_once(await read_stream(rabbitmq_testbed, target), range(ORDERS))

    # more orders: the query resumes from its checkpoint and adds exactly those, once each
    await publish_orders(rabbitmq_testbed, source, range(ORDERS, ORDERS + MORE_ORDERS))
    await finish(asyncio.ensure_future(asyncio.to_thread(
        pipeline.run, spark, uri, source, target, rabbitmq_unique_name, checkpoint)), spark, 120, "the resumed run")
    check_exactly_once(await read_stream(rabbitmq_testbed, target), range(ORDERS + MORE_ORDERS))
