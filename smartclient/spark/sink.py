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
4. publishing id = ``(batch_id << 32) | position of the row within its slot in this batch``;
5. the task waits for every confirm before it ends.

With an OpenTelemetry tracer provider given (``tracer_provider=``) or set on the driver (``smartclient[otel]``),
each batch is a ``send {stream}`` span there (its batch id, rows written and slots), around the Spark job
that publishes it.

A new checkpoint needs a new ``app_id``: batch ids restart at 0 with a new checkpoint, and the
broker would drop them as duplicates of the old run's.  ``spark.speculation`` must stay off: a
speculative task copy would be a second live producer with the same name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from smartclient import _otel
from smartclient._errors import ConfigurationError
from smartclient.spark.config import StreamConnection
from smartclient.spark.runtime import run_with_environment

__all__ = ["ExactlyOnceSink", "row_to_message"]

SLOT_COLUMN = "__smartclient_slot"
PART_COLUMN = "__smartclient_partition_key"
MAX_ROWS_PER_SLOT = 1 << 32


def row_to_message(row: Any, body_column: str, property_columns: Sequence[str]) -> Any:
    """A row as a message: ``body_column`` (binary or string) as the body; with ``property_columns``,
    an AMQP 1.0 message whose application properties are those columns."""
    body = row[body_column]
    if body is None:
        raise ConfigurationError(f"row has a null body column {body_column!r}")
    data = body.encode() if isinstance(body, str) else bytes(body)
    if not property_columns:
        return data
    from smartclient.stream._rstream import amqp_message

    properties = {name: _amqp_value(row[name]) for name in property_columns}
    return amqp_message(data, properties)


def _amqp_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    return str(value)


def _partition_keys(spark: Any, count: int) -> Any:
    """A map column ``slot -> key`` where Spark's hash partitioning sends ``key`` to partition ``slot``.

    Repartitioning by the slot itself hashes the values 0..count-1 into ``count`` partitions, and they
    collide (4 slots once filled only 2 of 4 partitions, one task carrying 70% of the rows).  The keys
    are found with the very expression Spark's HashPartitioning uses: pmod(hash(key), count).
    """
    from pyspark.sql import functions as F

    rows = spark.range(count * 64).select(
        F.col("id"), F.pmod(F.hash(F.col("id")), F.lit(count)).alias("p")).collect()
    keys: dict[int, int] = {}
    for row in rows:
        keys.setdefault(int(row["p"]), int(row["id"]))
    if len(keys) < count:  # practically impossible; a plain repartition still works, only less evenly
        keys = {slot: slot for slot in range(count)}
    return F.create_map(*[F.lit(v) for slot in range(count) for v in (slot, keys[slot])])


@dataclass(frozen=True)
class ExactlyOnceSink:
    """Call it as ``df.writeStream.foreachBatch(ExactlyOnceSink(...))``.

    :param connection: how executors reach the cluster (:class:`StreamConnection`).
    :param app_id: names the producers (``{app_id}-{slot}``); a new checkpoint needs a new app_id.
    :param stream: the target stream, or
    :param super_stream: the target super stream (then ``slots`` is its partition count).
    :param key_columns: the columns whose hash picks the slot.
    :param order_columns: the columns that, with the slot, totally order the rows of a batch.
    :param slots: number of slots (producers) for a plain stream.
    :param body_column: the message body (binary or string); other ``property_columns`` become
        application properties.  Or give ``to_message(row) -> bytes | AMQPMessage``.
    :param tracer_provider: the driver's OpenTelemetry ``TracerProvider`` for a span per batch (default: the
        global one, if set); never sent to the executors.
    """

    connection: StreamConnection
    app_id: str
    key_columns: Sequence[str]
    order_columns: Sequence[str]
    stream: str | None = None
    super_stream: str | None = None
    slots: int = 4
    body_column: str = "body"
    property_columns: Sequence[str] = ()
    to_message: Callable[[Any], Any] | None = field(default=None, compare=False)
    tracer_provider: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.stream is None) == (self.super_stream is None):
            raise ConfigurationError("give ExactlyOnceSink either stream= or super_stream=")
        if not self.app_id:
            raise ConfigurationError("app_id must not be empty: it names the producers")
        if not self.key_columns or not self.order_columns:
            raise ConfigurationError("ExactlyOnceSink needs key_columns and order_columns (a total order)")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or not 1 <= self.slots <= 200:
            raise ConfigurationError(f"slots must be between 1 and 200, not {self.slots!r}")

    # -- driver side ----------------------------------------------------------------------------
    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        spark = df.sparkSession
        if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
            raise ConfigurationError(
                "spark.speculation is on: a speculative task copy would be a second live producer with the same "
                "name, which breaks deduplication; turn it off for this query"
            )
        if not 0 <= batch_id < (1 << 31):
            raise ConfigurationError(f"batch id {batch_id} does not fit the publishing-id layout")
        targets = self._targets()
        slotted = self._with_slots(df, len(targets))
        if self.to_message is None and not self.property_columns:  # bodies reach Python as bytes already
            slotted = slotted.withColumn(self.body_column, F.col(self.body_column).cast("binary"))
        ordered = (slotted.withColumn(PART_COLUMN, _partition_keys(spark, len(targets))[F.col(SLOT_COLUMN)])
                   .repartition(len(targets), PART_COLUMN).sortWithinPartitions(SLOT_COLUMN, *self.order_columns))
        sink = replace(self, tracer_provider=None)  # what the executors get

        def write(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            written = sink._write_partition(batches, batch_id, targets)
            yield pa.RecordBatch.from_pydict({"written": [written]})

        # Arrow batches, not Row objects: handing Python one pickled Row per row would cost far more
        # than publishing it.
        tracer = _otel.tracer(self.tracer_provider)  # the driver's, once per batch
        if tracer is None:
            ordered.mapInArrow(write, "written long").groupBy().sum("written").collect()
            return
        target = self.stream or self.super_stream
        with _otel.use(tracer.start(f"send {target}", _otel.SpanKind.PRODUCER, {
                "messaging.system": "rabbitmq", "messaging.destination.name": str(target),
                "messaging.operation.name": "send", "messaging.operation.type": "send",
                "smartclient.spark.batch_id": batch_id, "smartclient.spark.app_id": self.app_id,
                "smartclient.spark.slots": len(targets)})) as span:
            [row] = ordered.mapInArrow(write, "written long").groupBy().sum("written").collect()
            span.set_attribute("messaging.batch.message_count", int(row[0] or 0))

    def _targets(self) -> list[str]:
        """The stream of each slot: the stream itself, or the super stream's partitions in order."""
        if self.stream is not None:
            return [self.stream] * self.slots
        super_stream = self.super_stream
        assert super_stream is not None

        async def partitions(env: Any) -> list[str]:
            return list(await env.partitions(super_stream))

        return run_with_environment(self.connection, partitions)

    def _with_slots(self, df: Any, count: int) -> Any:
        from pyspark.sql import functions as F
        from pyspark.sql.types import IntegerType

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
    def _write_partition(self, batches: Iterator[Any], batch_id: int, targets: list[str]) -> int:
        """Publish one Spark partition (Arrow record batches, sorted by slot then order); return the rows."""
        convert = self.to_message
        if convert is None and self.property_columns:
            def convert(row: Any) -> Any:
                return row_to_message(row, self.body_column, self.property_columns)
        # One producer per slot met in this task, all kept open until the end of the task; then every
        # confirm is awaited at once (slots are distinct producer names, so they may be live together).
        producers: dict[int, Any] = {}
        positions: dict[int, int] = {}
        state = {"written": 0}

        async def publish(env: Any, slots: list[int], bodies: list[Any]) -> None:
            start = 0
            while start < len(slots):  # one run of equal slots at a time: the rows are sorted by slot
                slot = slots[start]
                end = start
                while end < len(slots) and slots[end] == slot:
                    end += 1
                producer = producers.get(slot)
                if producer is None:
                    producer = producers[slot] = await env.producer(targets[slot], name=f"{self.app_id}-{slot}")
                position = positions.get(slot, 0)
                if position + (end - start) > MAX_ROWS_PER_SLOT:
                    raise ConfigurationError(f"more than 2**32 rows in slot {slot} of batch {batch_id}")
                await producer.send_many(bodies[start:end], first_publishing_id=(batch_id << 32) | position)
                positions[slot] = position + (end - start)
                start = end
            state["written"] += len(bodies)

        async def finish(env: Any) -> None:
            try:
                await asyncio.gather(*(p.flush() for p in producers.values()))  # every confirm, before the end
            finally:
                for producer in producers.values():
                    await producer.close()

        try:
            for batch in batches:
                slots = batch.column(SLOT_COLUMN).to_pylist()
                if convert is not None:
                    bodies = [convert(row) for row in batch.to_pylist()]
                else:
                    bodies = [b.encode() if isinstance(b, str) else b
                              for b in batch.column(self.body_column).to_pylist()]
                    if any(b is None for b in bodies):
                        raise ConfigurationError(f"a row has a null body column {self.body_column!r}")

                async def chunk(env: Any, slots: list[int] = slots, bodies: list[Any] = bodies) -> None:
                    await publish(env, slots, bodies)

                run_with_environment(self.connection, chunk)
        finally:
            run_with_environment(self.connection, finish)
        return int(state["written"])
