"""Spark Declarative Pipelines: ``examples/pipeline/`` run with ``spark-pipelines run``, twice, exactly once.

    python examples/spark_pipeline.py     # against the test bed's round-robin HAProxy

The pipeline (``examples/pipeline/spark-pipeline.yml`` and ``transformations/orders.py``) reads a stream into a
streaming table through the ``rabbitmq_stream`` reader and sends a flow of it into another stream through
``dp.create_sink(format="rabbitmq_stream")``.  This runs it on 600 orders; then, with 400 more published, runs it
again after taking the flow's last commit out of its checkpoint (as after a crash between writing a batch and
committing it, so the second run writes that batch again).  Ends with ``spark-pipeline OK: ...`` when the output
holds every order exactly once (exit status 0), else ``spark-pipeline FAILED: ...``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from resolvers import LoadBalancer
from smartclient import Address, Environment

DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:20052/"  # the test bed's round-robin HAProxy
PIPELINE = Path(__file__).resolve().parent / "pipeline"


def _lb(uri: str) -> LoadBalancer:
    return LoadBalancer(Address.parse(uri.split("@")[-1].split("/")[0]))


async def publish_orders(uri: str, stream: str, first: int, count: int) -> None:
    async with Environment(uri, resolver=_lb(uri)) as env:
        await env.create_stream(stream, exists_ok=True)
        if not count:
            return
        producer = await env.producer(stream)
        await producer.send_batch([json.dumps({"id": i, "customer": f"c{i % 11}", "amount": i * 1.5}).encode()
                                   for i in range(first, first + count)])


async def read_all(uri: str, stream: str) -> list[dict[str, Any]]:
    async with Environment(uri, resolver=_lb(uri)) as env:
        table = await env.read_arrow(stream, decode=True)
        return [json.loads(body) for body in table.column("body").to_pylist()]


def prepare(workdir: Path) -> Path:
    """The pipeline's spec in ``workdir`` (its storage there too), with the example's definitions beside it."""
    spec = (PIPELINE / "spark-pipeline.yml").read_text()
    spec = "\n".join(f"storage: {(workdir / 'storage').as_uri()}" if line.startswith("storage:") else line
                     for line in spec.splitlines())
    (workdir / "spark-pipeline.yml").write_text(spec + "\n")
    (workdir / "transformations").symlink_to(PIPELINE / "transformations", target_is_directory=True)
    return workdir / "spark-pipeline.yml"


#: PySpark 4.3.0's pipeline CLI ends with this once a Python data source ran: the data source's workers send empty
#: profiler accumulators, which reach the CLI as observed metrics it does not know (SPARK-59135, fixed upstream:
#: apache/spark#58435).  The run itself went on; a run it cut short is run again, and writes only what is left.
#: the Spark of ``spark-pipelines``: no UI, and a catalog kept between runs (Hive's, in the spec's directory: the
#: default one lives in memory, and a second run would find the streaming table's files and not the table)
CONF = ("--conf", "spark.ui.enabled=false", "--conf", "spark.sql.catalogImplementation=hive")
SPARK_59135 = "[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__"
COMPLETED = "Run is COMPLETED."


def run_pipeline(spec: Path, uri: str, source: str, target: str, timeout: float = 600.0, attempts: int = 3) -> str:
    """``spark-pipelines run --spec spec`` (its own local Spark, with a Connect server in it) until a run says it
    completed; its output.

    :raises RuntimeError: the run failed otherwise (with the end of its output)."""
    cli = Path(sys.executable).parent / "spark-pipelines"
    env = {**os.environ, "SMARTCLIENT_URI": uri, "SMARTCLIENT_SOURCE": source, "SMARTCLIENT_TARGET": target,
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_HOME", None)
    for _ in range(attempts):
        proc = subprocess.run([str(cli), "run", "--spec", str(spec), *CONF],
                              capture_output=True, text=True, env=env, timeout=timeout, cwd=spec.parent)
        out = proc.stdout + proc.stderr
        if proc.returncode == 0 or (SPARK_59135 in out and COMPLETED in out):
            return out
        if SPARK_59135 not in out:
            break
    raise RuntimeError(f"spark-pipelines run failed ({proc.returncode}): {out[-3000:]}")


def forget_last_commit(storage: Path) -> int:
    """Take the last commit out of every flow checkpoint under ``storage``; return how many were taken."""
    taken = 0
    for commits in storage.rglob("commits"):
        numbered = [p for p in commits.iterdir() if p.name.isdigit()]
        if numbered:
            last = max(int(p.name) for p in numbered)
            for name in (str(last), f".{last}.crc"):  # the commit and its checksum
                (commits / name).unlink(missing_ok=True)
            taken += 1
    return taken


def check(out: list[dict[str, Any]], count: int) -> tuple[bool, str]:
    ids = sorted(m["id"] for m in out)
    ok = ids == list(range(count)) and all(m["with_tax"] == round(m["id"] * 1.5 * 1.2, 2) for m in out)
    return ok, (f"{len(out)} taxed orders over two runs, {count - len(set(ids))} missing, "
                f"{len(ids) - len(set(ids))} duplicated")


def main() -> int:
    uri = os.environ.get("SMARTCLIENT_URI", DEFAULT_URI)
    suffix = uuid.uuid4().hex[:6]
    source, target = f"orders-{suffix}", f"orders-taxed-{suffix}"
    asyncio.run(publish_orders(uri, target, 0, 0))
    with tempfile.TemporaryDirectory() as work:
        spec = prepare(Path(work))
        asyncio.run(publish_orders(uri, source, 0, 600))
        run_pipeline(spec, uri, source, target)
        asyncio.run(publish_orders(uri, source, 600, 400))
        taken = forget_last_commit(Path(work) / "storage")
        run_pipeline(spec, uri, source, target)
    ok, what = check(asyncio.run(read_all(uri, target)), 1000)
    ok = ok and taken > 0  # the second run did write a batch again
    what += f", {taken} flow batch(es) run again"
    print(f"spark-pipeline {'OK' if ok else 'FAILED'}: {what}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
