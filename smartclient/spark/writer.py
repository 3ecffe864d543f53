"""The ``rabbitmq_stream`` format's writers: ``df.write`` and ``df.writeStream``, exactly once.

    spark.dataSource.register(RabbitStreamDataSource)
    (df.write.format("rabbitmq_stream").mode("append")
       .option("uri", "rabbitmq-stream://user:pw@lb:5552/").option("loadBalancer", "lb:5552")
       .option("stream", "orders").option("appId", "orders-2026-12-03").save())
    (df.writeStream.format("rabbitmq_stream").option("uri", ...).option("stream", "orders")
       .option("checkpointLocation", "/chk/orders").start())

Each Spark task writes its partition through one producer named ``{appId}-p{partition}``, on the stream's leader
(through the resolver, as every smartclient producer), with publishing id ``(batch << 32) | position of the row in
its partition``; the broker's deduplication drops what a retried task, a batch replayed from the checkpoint or a
re-run of the same batch write sends again.  The task returns once every row is confirmed.  What makes a replay
send the same rows at the same positions:

* the rows of a partition are sorted before they are written, by ``orderColumns`` (default: every column, so two
  rows that sort alike are the same row), since the order a partition's rows arrive in after a shuffle is not
  kept by a retry; ``keepInputOrder=true`` skips the sort for inputs replayed in the same order (smartclient's
  own source, files, with no shuffle after them);
* which rows a partition holds is Spark's: the same on a retry unless the plan has a non-deterministic
  expression (``rand()``...), which this writer cannot see (its plan is not given to a data source): keep them
  out of a query written exactly once.

The batch: a streaming query's micro-batch id (the task's local property ``streaming.sql.batchId``); a batch
write's ``batchId`` option (default 0).  The producer names: ``appId``, by default the streaming query's id,
which its checkpoint keeps (a restart from it resumes deduplication; a new checkpoint is a new query id), and for
a batch write a name drawn once per ``save()``, so that only that write's retries are deduplicated: give
``appId`` and ``batchId`` to make re-running a batch write idempotent.

``commit`` (the driver, every task done) logs what was written; ``abort`` cannot take back what the tasks that
finished have written to an append-only log, and says so: the batch's retry (a streaming query's restart, a batch
write run again with the same ``appId`` and ``batchId``) writes only the rest.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from smartclient._errors import ConfigurationError
from smartclient.core.routing import murmur3_32
from smartclient.spark._pyspark import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
    arrow_batches,
    local_property,
    partition_id,
)
from smartclient.spark.config import StreamConnection, flag_option
from smartclient.spark.runtime import run_with_environment
from smartclient.spark.sink import DEFAULT_SUB_ENTRY_SIZE, SLOT_COLUMN, ExactlyOnceSink

__all__ = ["WRITE_OPTIONS", "WriteSpec", "Written", "batch_writer", "stream_writer", "write_partition"]

log = logging.getLogger(__name__)

#: the options the writers take (Spark hands them over lower-cased), each with what it holds
WRITE_OPTIONS: dict[str, str] = {
    "uri": "the entry point, rabbitmq-stream://user:password@host:port/vhost (required)",
    "loadBalancer": "host:port of the load balancer: dial only it, placement still checked",
    "stream": "the stream written to",
    "superStream": "or the super stream written to (then keyColumns is its routing key)",
    "keyColumns": "comma-separated columns: a super stream's routing key, joined with '|'",
    "appId": "names the producers, {appId}-p{partition} (default: the query's id; a batch write: one per save())",
    "batchId": "a batch write's batch, 0 to 2**31 - 1 (default 0); a streaming query's is its own",
    "bodyColumn": "the message body, binary or string (default body)",
    "propertyColumns": "comma-separated columns sent as AMQP application properties",
    "subEntrySize": "the most rows per sub-entry, 1 to 65535 (default 100)",
    "compression": "a sub-entry's compression: none (default) or gzip (stream clients only read gzip)",
    "filterColumn": "the column whose text is each message's filter value (then one entry per row: subEntrySize 1)",
    "orderColumns": "comma-separated columns that order a partition's rows before writing (default: every column)",
    "keepInputOrder": "true: no sort, the input's own order (only for inputs replayed alike; default false)",
}
#: what Spark itself may hand a writer besides the user's options
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
_COMPRESSIONS = ("none", "gzip")
#: the rows of a record batch of a sorted partition, as the writer publishes them
_SORTED_BATCH_ROWS = 65_536
#: the task's local properties Spark sets for a micro-batch
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def _names(raw: str | None) -> tuple[str, ...]:
    return tuple(name.strip() for name in (raw or "").split(",") if name.strip())


def _whole(options: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigurationError(f"rabbitmq_stream option {name}={raw!r}: a whole number is needed") from None
    if not low <= value <= high:
        raise ConfigurationError(f"rabbitmq_stream option {name}={raw!r}: must be {low} to {high}")
    return value


@dataclass(frozen=True)
class WriteSpec:
    """The writers' options, checked on the driver and sent to the tasks."""

    connection: StreamConnection
    stream: str | None
    super_stream: str | None
    key_columns: tuple[str, ...]
    app_id: str | None
    batch_id: int
    body_column: str
    property_columns: tuple[str, ...]
    sub_entry_size: int
    compression: str
    filter_column: str | None
    order_columns: tuple[str, ...]
    keep_input_order: bool
    columns: tuple[str, ...]

    @classmethod
    def parse(cls, options: dict[str, str], columns: Sequence[str], *, streaming: bool) -> WriteSpec:
        """``options`` as Spark passes them (keys lower-cased), for rows of ``columns``.

        :raises ConfigurationError: an unknown option, a malformed one or a missing one, naming it."""
        known = {name.lower(): name for name in WRITE_OPTIONS}
        for key in options:
            if key not in known and key not in _SPARK_OPTIONS:
                raise ConfigurationError(f"rabbitmq_stream writer: unknown option {key!r} (known: "
                                         f"{', '.join(WRITE_OPTIONS)})")
        if streaming and "batchid" in options:
            raise ConfigurationError("rabbitmq_stream option batchId is for batch writes: a streaming query's "
                                     "batches are numbered by Spark")
        stream, super_stream = options.get("stream") or None, options.get("superstream") or None
        if (stream is None) == (super_stream is None):
            raise ConfigurationError("the rabbitmq_stream writer needs option('stream', ...) or "
                                     "option('superStream', ...), not both")
        compression = options.get("compression", "none").strip().lower()
        if compression not in _COMPRESSIONS:
            raise ConfigurationError(f"rabbitmq_stream option compression={compression!r}: use none or gzip")
        filter_column = options.get("filtercolumn") or None
        if filter_column is not None and compression != "none":
            raise ConfigurationError(f"rabbitmq_stream options filterColumn and compression={compression}: filter "
                                     "values go one entry per row, and only sub-entries are compressed")
        # with filter values, one entry per row unless told otherwise (then refused, below)
        sub_entry_default = 1 if filter_column is not None else DEFAULT_SUB_ENTRY_SIZE
        spec = cls(
            connection=StreamConnection.from_options(options, "writer"), stream=stream, super_stream=super_stream,
            key_columns=_names(options.get("keycolumns")), app_id=options.get("appid") or None,
            batch_id=_whole(options, "batchId", 0, 0, (1 << 31) - 1),
            body_column=options.get("bodycolumn", "body"), property_columns=_names(options.get("propertycolumns")),
            sub_entry_size=_whole(options, "subEntrySize", sub_entry_default, 1, 0xFFFF),
            compression=compression, filter_column=filter_column, order_columns=_names(options.get("ordercolumns")),
            keep_input_order=flag_option(options, "keepInputOrder", False), columns=tuple(columns))
        spec._check_columns()
        spec.sink("check")  # the sink's own checks (a super stream's key columns...)
        return spec

    def _check_columns(self) -> None:
        if self.super_stream is not None and not self.key_columns:
            raise ConfigurationError("rabbitmq_stream option superStream needs keyColumns: the routing key")
        if self.stream is not None and self.key_columns:
            raise ConfigurationError("rabbitmq_stream option keyColumns is a super stream's routing key: "
                                     "a stream takes none")
        if self.compression != "none" and self.sub_entry_size == 1:
            raise ConfigurationError(f"rabbitmq_stream option compression={self.compression}: it compresses "
                                     "sub-entries, so subEntrySize must be above 1")
        if self.filter_column is not None and self.sub_entry_size != 1:
            raise ConfigurationError(f"rabbitmq_stream option filterColumn: a sub-entry's messages cannot carry a "
                                     f"filter value each; leave subEntrySize out (or 1, not {self.sub_entry_size})")
        if self.keep_input_order and self.order_columns:
            raise ConfigurationError("rabbitmq_stream options keepInputOrder=true and orderColumns: give one")
        for option, names in (("bodyColumn", (self.body_column,)), ("keyColumns", self.key_columns),
                              ("propertyColumns", self.property_columns), ("orderColumns", self.order_columns),
                              ("filterColumn", (self.filter_column,) if self.filter_column else ())):
            missing = [name for name in names if name not in self.columns]
            if missing:
                raise ConfigurationError(f"rabbitmq_stream option {option}: no column {missing[0]!r} in the rows "
                                         f"(columns: {', '.join(self.columns)})")

    def sink(self, app_id: str) -> ExactlyOnceSink:
        """The foreachBatch sink's writer in its shuffle-free shape: what a task runs."""
        return ExactlyOnceSink(self.connection, app_id, key_columns=self.key_columns, stream=self.stream,
                               super_stream=self.super_stream, partitioning="input", body_column=self.body_column,
                               property_columns=self.property_columns, sub_entry_size=self.sub_entry_size,
                               compression=self.compression, filter_column=self.filter_column)

    def targets(self) -> list[str]:
        """The stream, or the super stream's partitions in order (read once, on the driver).

        :raises StreamNotFound: the stream (or the super stream) does not exist: before any task runs."""
        stream = self.stream
        if stream is None:
            return self.sink("targets")._targets()

        async def known(env: Any) -> None:
            await env.topology(stream)

        run_with_environment(self.connection, known)
        return [stream]


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    """A task's commit message: its producer, its batch and how many rows it wrote."""

    producer: str
    batch_id: int
    rows: int


def write_partition(spec: WriteSpec, targets: list[str], app_id: str, batch_id: int,
                    batches: Iterator[Any]) -> Written:
    """One task: its partition's rows, in order, through ``{app_id}-p{partition}``; every confirm awaited."""

    partition = partition_id()
    if partition is None:  # pragma: no cover - only ever called inside a Spark task
        raise ConfigurationError("the rabbitmq_stream writer runs inside a Spark task only")
    ordered = _ordered(spec, arrow_batches(batches))
    if spec.super_stream is not None:
        ordered = (_with_slot(spec, batch, len(targets)) for batch in ordered)
    written = spec.sink(app_id)._write_partition(ordered, batch_id, targets, partition)
    return Written(f"{app_id}-p{partition}", batch_id, written)


def _ordered(spec: WriteSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """The partition's record batches in the order they are written: as they came, or all of them sorted (not
    when they are in order already: the first order column strictly increasing, so no later column decides)."""
    if spec.keep_input_order:
        yield from batches
        return
    import pyarrow as pa

    every = [batch for batch in batches if batch.num_rows]
    if not every:
        return
    table = pa.Table.from_batches(every)
    keys = spec.order_columns or tuple(table.column_names)
    if _increasing(table.column(keys[0])):
        yield from every
        return
    yield from table.sort_by([(name, "ascending") for name in keys]).to_batches(max_chunksize=_SORTED_BATCH_ROWS)


def _increasing(column: Any) -> bool:
    """Whether ``column`` has no null, and each value is above the one before it (False where the type has no
    order Arrow compares)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count or len(column) < 2:
        return not column.null_count
    try:
        return bool(pc.all(pc.greater(column.slice(1), column.slice(0, len(column) - 1))).as_py())
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False


def _with_slot(spec: WriteSpec, batch: Any, count: int) -> Any:
    """``batch`` with the super stream partition of each row (the Java-compatible hash of its routing key)."""
    import pyarrow as pa

    keys = [batch.column(name).cast(pa.string()).to_pylist() for name in spec.key_columns]
    slots = [murmur3_32("|".join("" if v is None else v for v in parts).encode("utf-8")) % count
             for parts in zip(*keys, strict=True)]
    return batch.append_column(SLOT_COLUMN, pa.array(slots, pa.int32()))


def _log_commit(messages: Sequence[Any], batch_id: int) -> None:
    done = [m for m in messages if isinstance(m, Written)]
    log.info("rabbitmq_stream: batch %d written and confirmed, %d row(s) by %d task(s)", batch_id,
             sum(m.rows for m in done), len(done))


def _log_abort(messages: Sequence[Any], batch_id: int) -> None:
    done = [m for m in messages if isinstance(m, Written)]
    log.warning("rabbitmq_stream: batch %d aborted; %d task(s) had written %d row(s), which stay in the stream "
                "(append-only): the batch's retry with the same producer names writes only the rest",
                batch_id, len(done), sum(m.rows for m in done))


class _BatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, spec: WriteSpec) -> None:
        self.spec = spec
        self.app_id = spec.app_id or f"spark-{uuid.uuid4().hex[:12]}"  # drawn once, on the driver
        self.targets = spec.targets()

    def write(self, iterator: Iterator[Any]) -> Written:
        return write_partition(self.spec, self.targets, self.app_id, self.spec.batch_id, iterator)

    def commit(self, messages: list[Any]) -> None:
        _log_commit(messages, self.spec.batch_id)

    def abort(self, messages: list[Any]) -> None:
        _log_abort(messages, self.spec.batch_id)


class _StreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, spec: WriteSpec) -> None:
        self.spec = spec
        self.targets = spec.targets()

    def write(self, iterator: Iterator[Any]) -> Written:
        batch = local_property(BATCH_ID_PROPERTY)
        query = local_property(QUERY_ID_PROPERTY)
        if batch is None or (self.spec.app_id is None and query is None):  # pragma: no cover - Spark sets both
            raise ConfigurationError(f"the rabbitmq_stream stream writer found no {BATCH_ID_PROPERTY} or "
                                     f"{QUERY_ID_PROPERTY} in its task: it runs in a streaming query only")
        if not 0 <= int(batch) < (1 << 31):
            raise ConfigurationError(f"batch id {batch} does not fit the publishing-id layout")
        return write_partition(self.spec, self.targets, self.spec.app_id or str(query), int(batch), iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        _log_commit(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        _log_abort(messages, batchId)


def batch_writer(options: dict[str, str], columns: Sequence[str], overwrite: bool) -> _BatchWriter:
    _refuse_overwrite(overwrite)
    return _BatchWriter(WriteSpec.parse(options, columns, streaming=False))


def stream_writer(options: dict[str, str], columns: Sequence[str], overwrite: bool) -> _StreamWriter:
    _refuse_overwrite(overwrite)
    return _StreamWriter(WriteSpec.parse(options, columns, streaming=True))


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ConfigurationError("rabbitmq_stream: a stream is append-only; write with mode('append') (or "
                                 "outputMode('append')), not overwrite")

