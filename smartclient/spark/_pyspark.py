"""The one seam between smartclient and pyspark.

Only this module imports pyspark, and only here is a private name of pyspark touched.  The Spark helpers take
from it: the Data Source API's base classes (``source.py``), the column functions and types (``sink.py``), the
session builder (``session.py``), the partition of the task running (:func:`partition_id`), the read limits of
Python stream readers (:func:`read_limits`, PySpark 4.2+) and what a DataFrame's JVM plan shows
(:func:`jvm_plan`).

What the helpers rely on is listed in :data:`PYSPARK_INTERNALS` (private names), :data:`PYSPARK_NAMES` (public
names), :data:`PYSPARK_SIGNATURES` (parameters passed) and :data:`PYSPARK_READ_LIMITS` (names of the 4.2+ read
limits, used where present).  ``tests/unit/test_pyspark_seam.py`` checks every entry against the installed
pyspark and greps the library for pyspark imports outside this file; ``pyproject.toml`` pins pyspark>=4.0.1,<4.4
(and pandas below 3, which PySpark 4.3 warns about).  :data:`SPARK_JVM_CALLS` are Scala methods reached through
py4j: no Python check can see them, the shuffle-free integration tests run them.

Importing this module imports pyspark: the helpers import it where they need pyspark, so that
``import smartclient.spark`` imports none (the ``[spark]`` extra stays lazy).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pyspark
from pyspark import TaskContext
from pyspark.sql import SparkSession, functions
from pyspark.sql import datasource as _datasource
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import IntegerType

__all__ = [
    "ARROW_WRITERS",
    "PYSPARK_ARROW_WRITERS",
    "PYSPARK_INTERNALS",
    "PYSPARK_NAMES",
    "PYSPARK_READ_LIMITS",
    "PYSPARK_SIGNATURES",
    "PYSPARK_VERSION",
    "SPARK_JVM_CALLS",
    "DataSource",
    "DataSourceArrowWriter",
    "DataSourceReader",
    "DataSourceStreamArrowWriter",
    "DataSourceStreamReader",
    "DataSourceStreamWriter",
    "DataSourceWriter",
    "InputPartition",
    "IntegerType",
    "SparkSession",
    "WriterCommitMessage",
    "functions",
    "jvm_plan",
    "local_property",
    "partition_id",
    "read_limits",
]

PYSPARK_VERSION: str = pyspark.__version__

#: The Arrow writers of ``pyspark.sql.datasource`` the format's writers extend where this PySpark has them.
PYSPARK_ARROW_WRITERS: tuple[str, ...] = ("DataSourceArrowWriter", "DataSourceStreamArrowWriter")

#: The Arrow writers of Python data sources, where this PySpark has them (:data:`PYSPARK_ARROW_WRITERS`); else the
#: row writers, whose rows :func:`arrow_batches` turns into Arrow record batches.
ARROW_WRITERS: bool = all(hasattr(_datasource, name) for name in PYSPARK_ARROW_WRITERS)
DataSourceArrowWriter: Any = getattr(_datasource, "DataSourceArrowWriter", DataSourceWriter)
DataSourceStreamArrowWriter: Any = getattr(_datasource, "DataSourceStreamArrowWriter", DataSourceStreamWriter)

#: Every private attribute of pyspark the seam touches.
PYSPARK_INTERNALS: tuple[str, ...] = (
    # a classic (JVM-backed) DataFrame's Java Dataset, set by DataFrame.__init__: jvm_plan reads its plan.
    # Spark Connect's DataFrame has none (jvm_plan then raises AttributeError)
    "pyspark.sql.classic.dataframe.DataFrame._jdf",
)

#: Every public name of pyspark the Spark helpers use, as a module path.
PYSPARK_NAMES: tuple[str, ...] = (
    "pyspark.__version__",
    "pyspark.TaskContext.get",
    "pyspark.TaskContext.partitionId",
    "pyspark.TaskContext.getLocalProperty",
    "pyspark.sql.SparkSession.builder",
    "pyspark.sql.DataFrame.mapInArrow",
    "pyspark.sql.datasource.DataSource",
    "pyspark.sql.datasource.DataSourceReader",
    "pyspark.sql.datasource.DataSourceStreamReader",
    "pyspark.sql.datasource.DataSourceWriter",
    "pyspark.sql.datasource.DataSourceStreamWriter",
    "pyspark.sql.datasource.WriterCommitMessage",
    "pyspark.sql.Row.asDict",
    "pyspark.sql.datasource.InputPartition",
    "pyspark.sql.types.IntegerType",
    *(f"pyspark.sql.functions.{name}" for name in (
        "col", "concat_ws", "create_map", "hash", "lit", "pmod", "udf", "xxhash64")),
)

#: The parameters the helpers pass to pyspark's callables (a subset of each signature).
PYSPARK_SIGNATURES: dict[str, tuple[str, ...]] = {
    "pyspark.sql.functions.udf": ("f", "returnType", "useArrow"),  # useArrow=False: a plain row-at-a-time UDF
    "pyspark.sql.DataFrame.mapInArrow": ("func", "schema"),
}

#: The names of ``pyspark.sql.streaming.datasource`` the source uses where this PySpark has them (4.2+: admission
#: control for Python stream readers); before 4.2 the source refuses the options that need them.
PYSPARK_READ_LIMITS: tuple[str, ...] = (
    "ReadAllAvailable", "ReadMaxBytes", "ReadMaxRows", "ReadMinRows", "SupportsTriggerAvailableNow",
)

#: Scala methods :func:`jvm_plan` calls through py4j on the Java Dataset (not visible to a Python check).
SPARK_JVM_CALLS: tuple[str, ...] = (
    "Dataset.queryExecution", "QueryExecution.optimizedPlan", "LogicalPlan.deterministic",
    "QueryExecution.executedPlan", "SparkPlan.toString",
)


def read_limits() -> ModuleType | None:
    """``pyspark.sql.streaming.datasource``, the read limits of Python stream readers; None where this PySpark
    lacks the module (the names in it are :data:`PYSPARK_READ_LIMITS`, each checked by the caller)."""
    try:
        return importlib.import_module("pyspark.sql.streaming.datasource")
    except ImportError:
        return None


def partition_id() -> int | None:
    """The partition of the Spark task running this code; None outside a task."""
    context = TaskContext.get()
    return None if context is None else int(context.partitionId())


def arrow_batches(rows: Any, rows_per_batch: int = 10_000) -> Any:
    """What a writer's ``write()`` was given, as Arrow record batches: the batches themselves (an Arrow writer), or
    the rows of a row writer gathered into batches (PySpark without :data:`PYSPARK_ARROW_WRITERS`)."""
    if ARROW_WRITERS:
        yield from rows
        return
    import pyarrow as pa

    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row.asDict())
        if len(chunk) == rows_per_batch:
            yield pa.RecordBatch.from_pylist(chunk)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk)


def is_connect_session(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client's session (``SparkSession.builder.remote``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def local_property(name: str) -> str | None:
    """A local property of the Spark task running this code (Spark sets ``streaming.sql.batchId`` and
    ``sql.streaming.queryId`` for a micro-batch's tasks); None outside a task or where it is not set."""
    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(name)


def jvm_plan(df: Any) -> tuple[bool, str]:
    """Whether ``df``'s optimized plan is deterministic, and its executed plan as text (one operator a line).

    :raises Exception: ``df`` has no JVM plan to read (Spark Connect: AttributeError), or py4j failed.
    """
    execution = df._jdf.queryExecution()
    return bool(execution.optimizedPlan().deterministic()), str(execution.executedPlan().toString())
