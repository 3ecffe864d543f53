"""``ExactlyOnceSink``: a ``writeStream.foreachBatch`` sink to a stream or a super stream, exactly once.

Spark's foreachBatch is at-least-once: a batch (or one of its tasks) may run again.  This sink makes
every publishing id a pure function of the batch, so a replay publishes the same ids and the
broker's deduplication drops them:

1. each row gets a *slot* in ``0..slots-1`` from a deterministic hash of its key columns (never the
   task partition id, which Spark does not keep across replays); for a super stream the slot is the
   partition the Java-compatible hash of the key gives, so every row lands where the other clients
   would put it;
2. rows are repartitioned by slot and sorted within partitions by slot then ``order_columns``, which
   together must be a total order;
3. one producer per slot, named ``{app_id}-{slot}``, placed on its stream's leader through the
   Environment and its resolver (so the sink works behind a load balancer);
4. each producer's rows go in sub-entries (``sub_entry_size``, 100 rows by default): groups formed by a rule
   on the rows alone, so a replay forms the same ones, each stored and confirmed by the broker as one entry;
5. publishing id = ``(batch_id << 32) | position within its slot in this batch`` of the group's last row (of
   the row itself with ``sub_entry_size=1``);
6. the task waits for every confirm before it ends.

With an OpenTelemetry tracer provider given (``tracer_provider=``) or set on the driver (``smartclient[otel]``),
each batch is a ``send {stream}`` span there (its batch id, rows written and slots), around the Spark job
that publishes it.

**A shuffle-free mode** (``partitioning="input"``) is for inputs whose partitions are the same on every
replay of a batch (smartclient's own source, whose partitions are offset ranges written in Spark's offset
log; Kafka-style sources; files): each input partition is written in its own order by a producer named
``{app_id}-p{partition}``, with publishing id ``(batch_id << 32) | position of the row in its partition``.
No repartition and no sort.  The sink refuses it when the batch's plan shows a shuffle (an ``Exchange``:
an aggregation, a join that is not broadcast, ``repartition``, ``orderBy``, ``dropDuplicates``, a global
``limit``) or a non-deterministic expression (``rand()``, ``monotonically_increasing_id()``, a UDF marked
non-deterministic), since then a replayed batch could put other rows in a partition.

A new checkpoint needs a new ``app_id``: batch ids restart at 0 with a new checkpoint, and the
broker would drop them as duplicates of the old run's.  ``spark.speculation`` must stay off: a
speculative task copy would be a second live producer with the same name.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from smartclient import _otel
from smartclient._errors import ConfigurationError, MessageTooLarge
from smartclient.core.validation import choice, function, instance, provider, text, texts, whole
from smartclient.options import ProducerOptions
from smartclient.spark.config import StreamConnection
from smartclient.spark.records import binary_column, closed_ends, concat_columns, encode, lengths
from smartclient.spark.runtime import run_with_environment
from smartclient.stream.publish_frames import SUB_ENTRY_COMPRESSIONS, Records, as_part

__all__ = ["ExactlyOnceSink", "row_to_message"]

log = logging.getLogger(__name__)

SLOT_COLUMN = "__smartclient_slot"
PART_COLUMN = "__smartclient_partition_key"
MAX_ROWS_PER_SLOT = 1 << 32
#: rows per sub-entry by default (``sub_entry_size``)
DEFAULT_SUB_ENTRY_SIZE = 100
#: the most body bytes in one sub-entry: well inside the default frame max (1 MiB), headers included
SUB_ENTRY_BYTES = 1 << 19


def row_to_message(row: Any, body_column: str, property_columns: Sequence[str]) -> Any:
    """A row as a message: ``body_column`` (binary or string) as the body; with ``property_columns``,
    an AMQP 1.0 message whose application properties are those columns."""
    body = row[body_column]
    if body is None:
        raise ConfigurationError(f"row has a null body column {body_column!r}")
    data = body.encode() if isinstance(body, str) else bytes(body)
    if not property_columns:
        return data
    from smartclient.stream.codec import amqp_message

    properties = {name: _amqp_value(row[name]) for name in property_columns}
    return amqp_message(data, properties)


def _amqp_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    return str(value)


_PARTITION_KEYS: dict[int, dict[int, int]] = {}  # slot count -> {slot: key}, per driver process


def _partition_keys(spark: Any, count: int) -> Any:
    """A map column ``slot -> key`` where Spark's hash partitioning sends ``key`` to partition ``slot``.

    Repartitioning by the slot itself hashes the values 0..count-1 into ``count`` partitions, and they
    collide (4 slots once filled only 2 of 4 partitions, one task carrying 70% of the rows).  The keys
    are found with the very expression Spark's HashPartitioning uses: pmod(hash(key), count), on longs,
    and the map's values are longs too (hash() of an int differs from hash() of the same long).  One
    small Spark job per slot count, the first time.
    """
    from smartclient.spark._pyspark import functions as F

    keys = _PARTITION_KEYS.get(count)
    if keys is None:
        rows = spark.range(count * 64).select(
            F.col("id"), F.pmod(F.hash(F.col("id")), F.lit(count)).alias("p")).collect()
        keys = {}
        for row in rows:
            keys.setdefault(int(row["p"]), int(row["id"]))
        if len(keys) < count:  # practically impossible; a plain repartition still works, only less evenly
            keys = {slot: slot for slot in range(count)}
        _PARTITION_KEYS[count] = keys
    return F.create_map(*[F.lit(v).cast("long") for slot in range(count) for v in (slot, keys[slot])])


PARTITIONINGS = ("slots", "input")


@dataclass(frozen=True)
class ExactlyOnceSink:
    """Call it as ``df.writeStream.foreachBatch(ExactlyOnceSink(...))``.

    :param connection: how executors reach the cluster (:class:`StreamConnection`).
    :param app_id: names the producers (``{app_id}-{slot}``, or ``{app_id}-p{partition}`` with
        ``partitioning="input"``); a new checkpoint needs a new app_id.
    :param stream: the target stream, or
    :param super_stream: the target super stream (then ``slots`` is its partition count).
    :param key_columns: the columns whose hash picks the slot (with ``partitioning="input"``: a super
        stream's routing key only).
    :param order_columns: the columns that, with the slot, totally order the rows of a batch (not with
        ``partitioning="input"``: there the input's own order is kept).
    :param slots: number of slots (producers) for a plain stream (default 4; not with ``partitioning="input"``).
    :param partitioning: ``"slots"`` (default: rows repartitioned by slot and sorted) or ``"input"`` (each
        input partition written in its own order, no shuffle: only for inputs replayed with the same
        partitions; see the module's documentation).
    :param body_column: the message body (binary or string); other ``property_columns`` become
        application properties.  Or give ``to_message(row) -> bytes | AMQPMessage``.
    :param sub_entry_size: the most rows per sub-entry (default 100; 1: one entry per row).  Each producer's
        rows go in sub-entries of that many, or fewer where the next row would take a group's bodies over
        :data:`SUB_ENTRY_BYTES`, grouped in the producer's sequence (so a replay groups them alike), each with
        the position of its last row as its publishing id: the broker stores and confirms one entry per
        group, which cuts its work per row several times.  Stream clients read sub-entries as separate
        messages; AMQP 0.9.1 and 1.0 consumers of the stream too (uncompressed).
    :param compression: each sub-entry's, ``"none"`` (default) or ``"gzip"`` (then only stream clients read the
        stream; needs ``sub_entry_size`` above 1).
    :param filter_column: the column whose value (as text; a null: none) is each message's filter value, for
        consumers that filter (RabbitMQ 3.13+).  A sub-entry's messages cannot carry one each: needs
        ``sub_entry_size=1``.
    :param tracer_provider: the driver's OpenTelemetry ``TracerProvider`` for a span per batch (default: the
        global one, if set); never sent to the executors.
    """

    connection: StreamConnection
    app_id: str
    key_columns: Sequence[str] = ()
    order_columns: Sequence[str] = ()
    stream: str | None = None
    super_stream: str | None = None
    slots: int | None = None
    partitioning: str = "slots"
    body_column: str = "body"
    property_columns: Sequence[str] = ()
    to_message: Callable[[Any], Any] | None = field(default=None, compare=False)
    sub_entry_size: int = DEFAULT_SUB_ENTRY_SIZE
    compression: str = "none"
    tracer_provider: Any = field(default=None, compare=False, repr=False)
    filter_column: str | None = None

    def __post_init__(self) -> None:
        instance("ExactlyOnceSink.connection", self.connection, StreamConnection, optional=False)
        text("ExactlyOnceSink.app_id", self.app_id, note="it names the producers")
        for name in ("key_columns", "order_columns", "property_columns"):
            texts(f"ExactlyOnceSink.{name}", getattr(self, name), empty=True, note="column names")
        text("ExactlyOnceSink.stream", self.stream, optional=True)
        text("ExactlyOnceSink.super_stream", self.super_stream, optional=True)
        choice("ExactlyOnceSink.partitioning", self.partitioning, PARTITIONINGS)
        text("ExactlyOnceSink.body_column", self.body_column)
        function("ExactlyOnceSink.to_message", self.to_message, takes="row -> bytes or an AMQP message")
        provider("ExactlyOnceSink.tracer_provider", self.tracer_provider, "get_tracer", "TracerProvider")
        if (self.stream is None) == (self.super_stream is None):
            raise ConfigurationError("give ExactlyOnceSink either stream= or super_stream=")
        if self.partitioning == "input":
            if self.order_columns or self.slots is not None:
                raise ConfigurationError(
                    "partitioning='input' writes each input partition in its own order, one producer per partition: "
                    "order_columns and slots belong to partitioning='slots'")
            if self.super_stream is not None and not self.key_columns:
                raise ConfigurationError("partitioning='input' to a super stream needs key_columns: the routing key")
            if self.stream is not None and self.key_columns:
                raise ConfigurationError("partitioning='input' to a stream takes no key_columns: no slot is picked")
        elif not self.key_columns or not self.order_columns:
            raise ConfigurationError("ExactlyOnceSink needs key_columns and order_columns (a total order)")
        whole("ExactlyOnceSink.slots", self.slots, low=1, high=200, optional=True)
        whole("ExactlyOnceSink.sub_entry_size", self.sub_entry_size, low=1, high=0xFFFF, note="rows")
        choice("ExactlyOnceSink.compression", self.compression, tuple(SUB_ENTRY_COMPRESSIONS))
        if self.compression != "none" and self.sub_entry_size == 1:
            raise ConfigurationError(f"ExactlyOnceSink.compression={self.compression!r} compresses sub-entries: "
                                     "give sub_entry_size above 1")
        text("ExactlyOnceSink.filter_column", self.filter_column, optional=True)
        if self.filter_column is not None and self.sub_entry_size != 1:
            raise ConfigurationError(f"ExactlyOnceSink.filter_column={self.filter_column!r}: a sub-entry's messages "
                                     f"cannot carry a filter value each; give sub_entry_size=1 (not "
                                     f"{self.sub_entry_size})")

    # -- driver side ----------------------------------------------------------------------------
    def __call__(self, df: Any, batch_id: int) -> None:
        prepared, targets = self.prepare(df, batch_id)
        sink = replace(self, tracer_provider=None)  # what the executors get
        shuffle_free = self.partitioning == "input"

        def write(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            partition = _partition_id() if shuffle_free else None
            written = sink._write_partition(batches, batch_id, targets, partition)
            yield pa.RecordBatch.from_pydict({"written": [written]})

        # Arrow batches, not Row objects: handing Python one pickled Row per row would cost far more
        # than publishing it.
        tracer = _otel.tracer(self.tracer_provider)  # the driver's, once per batch
        if tracer is None:
            prepared.mapInArrow(write, "written long").groupBy().sum("written").collect()
            return
        target = self.stream or self.super_stream
        with _otel.use(tracer.start(f"send {target}", _otel.SpanKind.PRODUCER, {
                "messaging.system": "rabbitmq", "messaging.destination.name": str(target),
                "messaging.operation.name": "send", "messaging.operation.type": "send",
                "smartclient.spark.batch_id": batch_id, "smartclient.spark.app_id": self.app_id,
                "smartclient.spark.partitioning": self.partitioning,
                "smartclient.spark.slots": len(targets)})) as span:
            [row] = prepared.mapInArrow(write, "written long").groupBy().sum("written").collect()
            span.set_attribute("messaging.batch.message_count", int(row[0] or 0))

    def prepare(self, df: Any, batch_id: int = 0) -> tuple[Any, list[str]]:
        """The batch as the sink's writers get it, and the stream of each slot: every check, and all the
        work Spark does before a message is published (the slot column; with ``partitioning="slots"``
        the repartition by slot and the sort).  ``bench/spark_sink.py`` times it alone as the floor.

        :raises ConfigurationError: speculation is on, the batch id does not fit, the filter column is missing, or
            (``"input"``) the plan has a shuffle or a non-deterministic expression."""
        from smartclient.spark._pyspark import functions as F

        spark = df.sparkSession
        if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
            raise ConfigurationError(
                "spark.speculation is on: a speculative task copy would be a second live producer with the same "
                "name, which breaks deduplication; turn it off for this query"
            )
        if not 0 <= batch_id < (1 << 31):
            raise ConfigurationError(f"batch id {batch_id} does not fit the publishing-id layout")
        if self.filter_column is not None and self.filter_column not in df.columns:
            raise ConfigurationError(f"ExactlyOnceSink.filter_column={self.filter_column!r}: no such column in the "
                                     f"batch (columns: {', '.join(df.columns)})")
        if self.partitioning == "input":
            _require_replayable_partitions(df)
        targets = self._targets()
        slotted = self._with_slots(df, len(targets)) if len(targets) > 1 or self.partitioning == "slots" else df
        if self.to_message is None and not self.property_columns:  # bodies reach Python as bytes already
            slotted = slotted.withColumn(self.body_column, F.col(self.body_column).cast("binary"))
        if self.partitioning == "input":
            return slotted, targets
        ordered = (slotted.withColumn(PART_COLUMN, _partition_keys(spark, len(targets))[F.col(SLOT_COLUMN)])
                   .repartition(len(targets), PART_COLUMN).sortWithinPartitions(SLOT_COLUMN, *self.order_columns))
        return ordered, targets

    def _targets(self) -> list[str]:
        """The stream of each slot: the stream itself (once per slot; once in ``"input"`` mode), or the
        super stream's partitions in order."""
        if self.stream is not None:
            return [self.stream] * (1 if self.partitioning == "input" else self.slots or DEFAULT_SLOTS)
        super_stream = self.super_stream
        assert super_stream is not None

        async def partitions(env: Any) -> list[str]:
            return list(await env.partitions(super_stream))

        return run_with_environment(self.connection, partitions)

    def _with_slots(self, df: Any, count: int) -> Any:
        from smartclient.spark._pyspark import IntegerType
        from smartclient.spark._pyspark import functions as F

        if self.stream is not None:
            return df.withColumn(SLOT_COLUMN, F.pmod(F.xxhash64(*[F.col(c) for c in self.key_columns]),
                                                     F.lit(count)).cast("int"))
        from smartclient.core.routing import murmur3_32

        def java_slot(key: str) -> int:
            return murmur3_32(key.encode("utf-8")) % count

        key = (F.col(self.key_columns[0]).cast("string") if len(self.key_columns) == 1
               else F.concat_ws("|", *[F.col(c).cast("string") for c in self.key_columns]))
        # useArrow=False: a plain row-at-a-time UDF on every PySpark.  Left unsaid, PySpark 4.3 tries to
        # infer a pandas/Arrow UDF type from the hints (str -> int), fails and warns on each call.
        return df.withColumn(SLOT_COLUMN, F.udf(java_slot, IntegerType(), useArrow=False)(key))

    # -- executor side --------------------------------------------------------------------------
    def _write_partition(self, batches: Iterator[Any], batch_id: int, targets: list[str],
                         partition: int | None = None) -> int:
        """Publish one Spark partition's Arrow record batches; return the rows.  With ``partition`` (the
        ``"input"`` mode) the rows are in the input's order, and go out under ``{app_id}-p{partition}``;
        without, they are sorted by slot then order, and slot ``s`` goes out under ``{app_id}-{s}``."""
        convert = self.to_message
        if convert is None and self.property_columns:
            def convert(row: Any) -> Any:
                return row_to_message(row, self.body_column, self.property_columns)
        writer = _TaskWriter(batch_id, self.sub_entry_size, self.compression, self.filter_column is not None)
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                bodies: Any  # a list of messages, or the column of bodies (sent without a Python object each)
                if convert is not None:
                    bodies = [convert(row) for row in batch.to_pylist()]
                else:
                    bodies = binary_column(batch.column(self.body_column), self.body_column)
                if self.filter_column is not None:
                    bodies = filtered(bodies, batch.column(self.filter_column), self.filter_column)
                runs = self._runs(batch, targets, partition, bodies)
                run_with_environment(self.connection, functools.partial(writer.publish_runs, runs=runs))
        except BaseException:
            # a failed task's unfinished sub-entries are not sent short: its retry sends those rows in whole
            # groups, under ids above the short ones', so the broker would store the short ones' rows twice
            writer.held.clear()
            raise
        finally:
            run_with_environment(self.connection, writer.finish)
        return writer.written

    def _runs(self, batch: Any, targets: list[str], partition: int | None,
              bodies: Any) -> list[tuple[str, str, Any]]:
        """``(stream, producer name, bodies in order)`` for one Arrow batch; ``bodies`` a list of messages or a
        column of bodies (:func:`~smartclient.spark.records.binary_column`), and each run's likewise."""
        if partition is not None and len(targets) == 1:
            return [(targets[0], f"{self.app_id}-p{partition}", bodies)]
        import pyarrow.compute as pc

        slots = batch.column(SLOT_COLUMN)
        if partition is not None:  # the input's order, spread over a super stream's partitions
            name = f"{self.app_id}-p{partition}"
            if isinstance(bodies, list):
                grouped: dict[int, list[Any]] = {}
                for slot, body in zip(slots.to_pylist(), bodies, strict=True):
                    grouped.setdefault(slot, []).append(body)
                return [(targets[slot], name, group) for slot, group in grouped.items()]
            return [(targets[slot], name, bodies.filter(pc.equal(slots, slot)))
                    for slot in pc.unique(slots).to_pylist()]
        runs = pc.run_end_encode(slots)  # sorted by slot: one run per slot
        out = []
        start = 0
        for slot, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
            out.append((targets[slot], f"{self.app_id}-{slot}", bodies[start:end]))
            start = end
        return out


DEFAULT_SLOTS = 4


def _partition_id() -> int:
    from smartclient.spark._pyspark import partition_id

    partition = partition_id()
    if partition is None:  # pragma: no cover - only ever called inside a Spark task
        raise ConfigurationError("partitioning='input' runs inside a Spark task only")
    return partition


def _same(batches: Iterator[Any]) -> Iterator[Any]:  # pragma: no cover - planned, never run
    return batches


def _require_replayable_partitions(df: Any) -> None:
    """Refuse the ``"input"`` mode when the batch's plan shows a shuffle or a non-deterministic
    expression: then a replayed batch may put other rows, or other orders, in a partition."""
    from smartclient.spark._pyspark import jvm_plan

    try:
        # as the writers will run it: under a Python map (a limit at the top of a plan shows its shuffle then)
        deterministic, plan = jvm_plan(df.mapInArrow(_same, df.schema))
    except Exception:  # Spark Connect (no JVM plan to look at)
        log.warning("partitioning='input': the batch's plan cannot be inspected here; it is assumed to have "
                    "no shuffle and no non-deterministic expression")
        return
    if not deterministic:
        raise ConfigurationError(
            "partitioning='input' needs a deterministic batch, and its plan has a non-deterministic expression "
            "(rand(), monotonically_increasing_id(), a UDF marked non-deterministic...): a replay could differ; "
            "use partitioning='slots'")
    shuffles = [line.strip(" +-:*") for line in plan.splitlines()
                if re.search(r"(^|[\s+\-:*])(Exchange|ShuffleExchange)\b", line)]
    if shuffles:
        raise ConfigurationError(
            f"partitioning='input' needs a batch without a shuffle, and its plan has one ({shuffles[0]}): a replay "
            "could put other rows in a partition; use partitioning='slots'")


class FilteredBody(bytes):
    """A body with the filter value it is sent with (:func:`filtered`)."""

    smartclient_filter: str | None


def filtered(bodies: Any, values: Any, column: str = "filter") -> list[Any]:
    """``bodies`` (a list of messages or a column of bodies), each carrying its filter value: the text of
    ``values`` (an Arrow column), None for a null.  The messages themselves are left as they are (a copy carries
    the value), so one object given for several rows carries each row's.

    :raises ConfigurationError: a filter value that is not text, or a message that cannot carry one."""
    import pyarrow as pa

    try:
        texts = values.cast(pa.string()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConfigurationError(f"the filter column {column!r} ({values.type}) does not read as text: {exc}") from None
    out: list[Any] = []
    for body, value in zip(bodies if isinstance(bodies, list) else bodies.to_pylist(), texts, strict=True):
        carrier: Any = FilteredBody(body) if isinstance(body, bytes | bytearray | memoryview) else copy.copy(body)
        try:
            carrier.smartclient_filter = value
        except (AttributeError, TypeError):
            raise ConfigurationError(f"a message of type {type(body).__name__} cannot carry a filter value: "
                                     "give bytes or an AMQP message") from None
        out.append(carrier)
    return out


def filter_value_of(message: Any) -> str | None:
    """A filtered producer's ``filter_value``: what :func:`filtered` gave the message."""
    return getattr(message, "smartclient_filter", None)


def closed_groups(sizes: list[int], most: int) -> list[int]:
    """Where the groups of rows of ``sizes`` bytes end (exclusive indexes), for the groups that are closed: a
    group closes at ``most`` rows, or before the row that would take it over :data:`SUB_ENTRY_BYTES`.  The rows
    after the last end form a group still open.  A rule on the rows alone, so a replay of the same rows, however
    Spark's batches cut them, forms the same groups."""
    ends: list[int] = []
    count = total = 0
    for index, size in enumerate(sizes):
        if count and total + size > SUB_ENTRY_BYTES:
            ends.append(index)
            count = total = 0
        count += 1
        total += size
        if count == most:
            ends.append(index + 1)
            count = total = 0
    return ends


class _TaskWriter:
    """One task's producers: one per (stream, name) met, all kept open to the end of the task, then
    every confirm awaited at once (the names are distinct, so they may be live together).  With sub-entries,
    the rows of a group not yet full wait here for the next run of the same producer, or for the end."""

    def __init__(self, batch_id: int, sub_entry_size: int = 1, compression: str = "none",
                 filtered: bool = False) -> None:
        self.batch_id = batch_id
        self.sub_entry_size = sub_entry_size
        self.compression = compression
        self.options = ProducerOptions(filter_value=filter_value_of) if filtered else ProducerOptions()
        self.producers: dict[tuple[str, str], Any] = {}
        self.positions: dict[tuple[str, str], int] = {}
        self.held: dict[tuple[str, str], Any] = {}  # rows of an unfinished sub-entry (a list or a column), per producer
        self.written = 0

    async def publish_runs(self, env: Any, runs: list[tuple[str, str, Any]]) -> None:
        for stream, name, bodies in runs:
            key = (stream, name)
            producer = self.producers.get(key)
            if producer is None:
                producer = self.producers[key] = await env.producer(stream, replace(self.options, name=name))
            position = self.positions.get(key, 0)
            if position + len(bodies) > MAX_ROWS_PER_SLOT:
                raise ConfigurationError(f"more than 2**32 rows for producer {name} of batch {self.batch_id}")
            if self.sub_entry_size == 1:
                await producer.send_many(bodies if isinstance(bodies, list) else bodies.to_pylist(),
                                         first_publishing_id=(self.batch_id << 32) | position)
            elif isinstance(bodies, list):
                await self._sub_entries(key, producer, bodies, position)
            else:
                await self._column_sub_entries(key, producer, bodies, position)
            self.positions[key] = position + len(bodies)
            self.written += len(bodies)

    async def _sub_entries(self, key: tuple[str, str], producer: Any, bodies: list[Any], position: int) -> None:
        """Every closed group of the producer's rows (:func:`closed_groups`) as one sub-entry whose publishing
        id is its last row's position; the rest waits for more rows, or for :meth:`finish`."""
        rows = self.held.pop(key, []) + [as_part(body) for body in bodies]  # encoded once, sized, then sent
        start = position + len(bodies) - len(rows)
        first = 0
        for end in closed_groups(list(map(len, rows)), self.sub_entry_size):
            await self._send_group(producer, rows[first:end], start + end - 1)
            first = end
        if first < len(rows):
            self.held[key] = rows[first:]

    async def _column_sub_entries(self, key: tuple[str, str], producer: Any, bodies: Any, position: int) -> None:
        """:meth:`_sub_entries` for a column of bodies (:mod:`smartclient.spark.records`): the same groups, each
        one slice of the rows' records encoded at once."""
        held = self.held.pop(key, None)
        rows = bodies if held is None else concat_columns(held, bodies)
        start = position + len(bodies) - len(rows)
        ends = closed_ends(lengths(rows), self.sub_entry_size, SUB_ENTRY_BYTES)
        first = 0
        if ends:
            data, starts = encode(rows.slice(0, ends[-1]), producer.encoding == "amqp")
            for end in ends:
                try:
                    await producer.send_sub_entry(Records(data[starts[first]:starts[end]], end - first,
                                                          producer.encoding == "amqp"),
                                                  publishing_id=(self.batch_id << 32) | (start + end - 1),
                                                  compression=self.compression)
                except MessageTooLarge:
                    await self._send_group(producer, rows.slice(first, end - first), start + end - 1)
                first = end
        if first < len(rows):
            self.held[key] = rows.slice(first)

    async def _send_group(self, producer: Any, rows: Any, last: int) -> None:
        """``rows`` as one sub-entry whose id is ``last`` (its last row's position); if they do not fit the frame
        max the broker negotiated (below the default 1 MiB), as two halves, each under its own last row's
        position: a replay against the same broker splits them alike, and any other split only stores rows twice,
        never drops one."""
        if not isinstance(rows, list):  # a column's rows
            data, starts = encode(rows, producer.encoding == "amqp")
            group: Any = Records(data[starts[0]:starts[-1]], len(rows), producer.encoding == "amqp")
        else:
            group = rows
        try:
            await producer.send_sub_entry(group, publishing_id=(self.batch_id << 32) | last,
                                          compression=self.compression)
        except MessageTooLarge:
            if len(rows) == 1:
                raise
            half = len(rows) // 2
            await self._send_group(producer, rows[:half], last - (len(rows) - half))
            await self._send_group(producer, rows[half:], last)

    async def finish(self, env: Any) -> None:
        try:
            for key, rows in self.held.items():  # the last group of each producer, however short
                await self._send_group(self.producers[key], rows, self.positions[key] - 1)
            await asyncio.gather(*(p.flush() for p in self.producers.values()))  # every confirm, before the end
        finally:
            for producer in self.producers.values():
                await producer.close()
