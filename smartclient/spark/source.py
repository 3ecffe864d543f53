"""``RabbitStreamDataSource``: streams as a Spark source, through the Python Data Source API (PySpark 4.0+).

    spark.dataSource.register(RabbitStreamDataSource)
    df = (spark.read.format("rabbitmq_stream")            # or spark.readStream
          .option("uri", "rabbitmq-stream://user:pw@lb:5552/").option("loadBalancer", "lb:5552")
          .option("streams", "orders,payments").load())

Rows: ``stream`` string, ``offset`` long, ``timestamp`` long (the chunk's, in ms), ``body`` binary.
Offsets are ``{stream: next offset}``.  Options:

* ``decode``: ``none`` (default: ``body`` is the message as a stream consumer hands it over: the bytes a
  smartclient producer sent, else the message as stored) or ``amqp``: each message is an AMQP 1.0 message (what
  smartclient's producers write by default, and RabbitMQ stores for MQTT and AMQP 0.9.1 publishers and rstream's
  ``AMQPMessage``), decoded by rstream; ``body`` is its body, and a ``routing_key`` string column holds the
  ``x-routing-key`` annotation (for MQTT: the topic, ``/`` turned into ``.``); a message that is not one (written
  with ``encoding="raw"``) fails the batch with :class:`MessageDecodeError`, naming its offset;

* ``uri`` (required), ``loadBalancer`` (``host:port``: dial only the LB, placement still checked);
* ``streams``: comma-separated;
* batch: ``startingOffsets`` / ``endingOffsets``: ``earliest``/``latest`` or JSON ``{"stream": offset}``;
* ``maxRecordsPerPartition`` (default 50000): a range is split into partitions of at most that many;
* ``minPartitions``: at least that many partitions per batch (the ranges split in proportion to their
  size, as Kafka's source does), for parallelism when few streams carry much; partitions depend only on
  the batch's offsets and these two options, so a replayed batch reads the same partitions;
* ``failOnDataLoss`` (default ``true``): a range whose first offsets retention removed from the stream
  fails the read with :class:`~smartclient.DataLoss`, naming the stream and the lost offsets; ``false``
  skips them with a warning (in the executor's log) and reads what is left;
* streaming: ``startingOffsets`` (``earliest``, default, or ``latest``), and admission control
  (:mod:`smartclient.spark.admission`), which needs PySpark 4.2+ (``latestOffset(start, limit)`` and
  ``getDefaultReadLimit()``; on 4.0 and 4.1 these options are refused with a clear error):

  - ``maxRecordsPerTrigger``: each micro-batch ends at most that many records past its start, summed
    over ``streams`` (shared out evenly, what one stream leaves unused going to the others);
  - ``maxBytesPerTrigger``: at most about that many bytes, shared out the same way, each stream's
    records weighed at the mean size of up to 64 records from where its batch starts (read on the
    driver when that moved); a record over the budget goes alone, on its stream's turn;
  - ``minOffsetsPerTrigger``: no batch until that many records are new over ``streams``, or
    ``maxTriggerDelay`` (default ``15m``; ``30s``, ``5m``...) has passed since the last trigger that was
    not held back (the query's first trigger never waits), as Kafka's source does.

  On 4.2+ ``Trigger.AvailableNow`` stops where the streams end when the query starts, in capped batches
  (never held back by ``minOffsetsPerTrigger``); ``Trigger.Once`` reads all there is in one batch.

How far a query lags: :func:`offsets_behind` of ``query.lastProgress`` gives, per stream, how many
offsets the batch's end was behind the stream's end when the batch was planned (``reportLatestOffset``,
PySpark 4.2+; Python sources cannot report custom source metrics).

A stream's end comes from StreamStats: ``committed_offset`` + 1 where the broker reports it
(RabbitMQ 4.3); otherwise (4.0) it is inferred by reading the last committed chunk.

Readers run on the executors and are placed on replicas like any smartclient consumer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from smartclient._errors import ConfigurationError
from smartclient._pyarrow import arrow
from smartclient.core.delivery import Chunk
from smartclient.options import ConsumerOptions
from smartclient.spark._pyspark import (
    PYSPARK_VERSION,
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    read_limits,
)
from smartclient.spark.admission import DEFAULT_RECORD_BYTES, cap_batch_end, duration_seconds, hold_batch
from smartclient.spark.config import StreamConnection, flag_option
from smartclient.spark.runtime import run_with_environment
from smartclient.stream.codec import decode_amqp
from smartclient.stream.columnar import iter_range, next_offset

__all__ = ["RabbitStreamDataSource", "admission_control_supported", "cap_batch_end", "next_offsets", "offsets_behind"]

log = logging.getLogger(__name__)

SCHEMA = "stream string, offset long, timestamp long, body binary"
AMQP_SCHEMA = SCHEMA + ", routing_key string"


def _decode_option(options: dict[str, str]) -> bool:
    value = options.get("decode", "none").strip().lower()
    if value not in ("none", "amqp"):
        raise ConfigurationError(f"option decode={value!r}: use 'none' or 'amqp'")
    return value == "amqp"


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    stream: str
    start: int
    end: int  # exclusive


def _options(raw: Any) -> dict[str, str]:
    """Spark passes data-source options with lower-cased keys: look every name up lower-cased."""
    return {str(k).lower(): str(v) for k, v in dict(raw).items()}


def _connection(options: dict[str, str]) -> StreamConnection:
    return StreamConnection.from_options(options, "source")


def _streams(options: dict[str, str]) -> list[str]:
    streams = [s.strip() for s in options.get("streams", "").split(",") if s.strip()]
    if not streams:
        raise ConfigurationError("the rabbitmq_stream source needs option('streams', 'a,b')")
    return streams


_OPTION_NAMES = {name.lower(): name for name in (
    "maxRecordsPerPartition", "minPartitions", "maxRecordsPerTrigger", "maxBytesPerTrigger", "minOffsetsPerTrigger")}


@dataclass(frozen=True)
class _Reading:
    """The options every reader shares: how to reach the cluster, which streams, how to split and read."""

    connection: StreamConnection
    streams: list[str]
    size: int
    min_partitions: int | None
    decode: bool
    fail_on_data_loss: bool

    @classmethod
    def of(cls, options: dict[str, str]) -> _Reading:
        return cls(_connection(options), _streams(options),
                   _int_option(options, "maxrecordsperpartition", 50_000) or 50_000,
                   _int_option(options, "minpartitions", None), _decode_option(options),
                   flag_option(options, "failOnDataLoss", True))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[OffsetRange]:
        return _split(start, end, self.size, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.connection, partition, self.decode, self.fail_on_data_loss)


def _int_option(options: dict[str, str], name: str, default: int | None) -> int | None:
    """Option ``name`` (lower-cased, as Spark passes it) as a positive whole number; errors use the name as
    documented (``maxBytesPerTrigger``)."""
    raw = options.get(name)
    if raw is None:
        return default
    shown = _OPTION_NAMES.get(name, name)
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"option {shown}={raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigurationError(f"option {shown}={value} must be positive")
    return value


def next_offsets(connection: StreamConnection, streams: Sequence[str]) -> dict[str, int]:
    """``{stream: next offset}`` for each stream: where each stream ends now."""

    async def work(env: Any) -> dict[str, int]:
        return {stream: await next_offset(env, stream) for stream in streams}

    return run_with_environment(connection, work)


SAMPLE_RECORDS = 64  # maxBytesPerTrigger weighs a stream's records by the mean of up to this many


async def _record_bytes(env: Any, stream: str, offset: int, available: int) -> float:
    """The mean size in bytes of up to :data:`SAMPLE_RECORDS` records of ``stream`` from ``offset`` (of
    which ``available`` are there), as read (a compressed sub-entry's messages decompressed):
    ``maxBytesPerTrigger``'s estimate of what the next records weigh."""
    from smartclient.core.offsets import OffsetSpec

    want = max(min(SAMPLE_RECORDS, available), 1)
    sizes: list[int] = []
    got = asyncio.Event()

    def on_chunk(chunk: Chunk) -> None:
        if len(sizes) < want:
            sizes.extend(len(body) for _, body in chunk)
            if len(sizes) >= want:
                got.set()

    consumer = await env.consumer(stream, on_chunk=on_chunk, options=ConsumerOptions(OffsetSpec.at(offset)))
    try:
        await got.wait()
    finally:
        await consumer.close()
    return sum(sizes[:want]) / want


def record_bytes(connection: StreamConnection, at: dict[str, int], available: dict[str, int],
                 wait: float = 10.0) -> dict[str, float]:
    """``{stream: mean record size}`` from each ``{stream: offset}`` (the streams read at once, for up to
    ``wait`` seconds in all); a stream that could not be read in time, or failed, is left out with a
    warning: it keeps its last size, or counts :data:`~smartclient.spark.admission.DEFAULT_RECORD_BYTES`,
    and is tried again at the next trigger."""

    async def work(env: Any) -> dict[str, float]:
        streams = list(at)
        tasks = [asyncio.ensure_future(_record_bytes(env, s, at[s], available.get(s, 1))) for s in streams]
        done, pending = await asyncio.wait(tasks, timeout=wait)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        sizes: dict[str, float] = {}
        for stream, task in zip(streams, tasks, strict=True):
            if task in done and task.exception() is None:
                sizes[stream] = task.result()
            else:
                why = f"failed: {task.exception()!r}" if task in done else f"was not read within {wait:g} s"
                log.warning("maxBytesPerTrigger: sampling %r from offset %d %s; its records count as before "
                            "(%g bytes each at first)", stream, at[stream], why, DEFAULT_RECORD_BYTES)
        return sizes

    return run_with_environment(connection, work)


def _resolve(spec: str | None, default: str, streams: list[str], connection: StreamConnection) -> dict[str, int]:
    value = (spec or default).strip()
    if value == "earliest":
        return {s: 0 for s in streams}
    if value == "latest":
        return next_offsets(connection, streams)
    try:
        given = json.loads(value)
    except ValueError:
        raise ConfigurationError(f"offsets {value!r} must be 'earliest', 'latest' or JSON {{\"stream\": n}}") from None
    missing = [s for s in streams if s not in given]
    if missing or not all(isinstance(v, int) and v >= 0 for v in given.values()):
        raise ConfigurationError(f"offsets {value!r} must give a non-negative offset for every stream {streams}")
    return {s: int(given[s]) for s in streams}


ADMISSION_CONTROL_SINCE = "4.2"


def _require_admission_control(option: str, limit: str) -> None:
    """Refuse ``option`` where this PySpark lacks admission control for Python sources, or ``limit``."""
    if admission_control_supported() and hasattr(read_limits(), limit):
        return
    raise ConfigurationError(
        f"{option} needs admission control for Python data sources, which PySpark {PYSPARK_VERSION} does "
        f"not offer (it came in PySpark {ADMISSION_CONTROL_SINCE}: before, latestOffset() gets no start and no "
        f"limit; {limit} is what Spark hands back); split the work with maxRecordsPerPartition instead")


def admission_control_supported() -> bool:
    """Whether this PySpark gives Python stream readers admission control: 4.2 added
    ``DataSourceStreamReader.latestOffset(start, limit)``, ``getDefaultReadLimit()`` and ``ReadMaxRows``."""
    return hasattr(read_limits(), "ReadMaxRows") and hasattr(DataSourceStreamReader, "getDefaultReadLimit")


def _split(start: dict[str, int], end: dict[str, int], size: int,
           min_partitions: int | None = None) -> list[OffsetRange]:
    """Each stream's range in pieces of at most ``size``; with ``min_partitions``, at least that many
    pieces over all streams (as far as there are offsets), each range cut in proportion to its share."""
    ranges = [(stream, first, end.get(stream, first)) for stream, first in start.items()]
    total = sum(max(last - first, 0) for _, first, last in ranges)
    parts = []
    for stream, first, last in ranges:
        count = last - first
        if count <= 0:
            continue
        step = size
        if min_partitions is not None and total:
            pieces = max(math.ceil(count / size), math.ceil(count * min_partitions / total))
            step = max(math.ceil(count / min(pieces, count)), 1)
        for lo in range(first, last, step):
            parts.append(OffsetRange(stream, lo, min(lo + step, last)))
    return parts


def _read(connection: StreamConnection, partition: InputPartition, decode: bool = False,
          fail_on_data_loss: bool = True) -> Iterator[Any]:
    """The partition's offsets as Arrow batches in the source's schema, one per chunk (PySpark 4.0+ takes a
    ``RecordBatch`` from ``read()``): read by :func:`smartclient.stream.columnar.iter_range`, so placed on a
    replica, recovered, and ended right where offset-tracking chunks end a range."""
    if not isinstance(partition, OffsetRange):
        raise ConfigurationError(f"unexpected partition {partition!r} for the rabbitmq_stream source")
    part = partition
    if part.end <= part.start:
        return iter(())
    pa, _ = arrow()
    stream = part.stream

    def columns(chunk: Chunk) -> Any:
        if decode:  # from the messages as stored (a body sent as one data section is handed over without it)
            values, keys = [], []
            for offset, message in zip(chunk.offsets, chunk.stored, strict=True):
                value, key = decode_amqp(message, stream=stream, offset=offset)
                values.append(value)
                keys.append(key)
            offsets, body, extra = pa.array(chunk.offsets, pa.int64()), pa.array(values, pa.binary()), [
                pa.array(keys, pa.string())]
        else:
            batch = chunk.to_arrow()
            offsets, body, extra = batch.column("offset"), batch.column("body").cast(pa.binary()), []  # (one copy)
        count = len(chunk)
        return pa.RecordBatch.from_arrays(
            [pa.repeat(pa.scalar(stream, pa.string()), count), offsets,
             pa.repeat(pa.scalar(chunk.timestamp, pa.int64()), count), body, *extra], schema=_arrow_schema(decode))

    async def work(env: Any) -> list[Any]:
        return [batch async for batch in iter_range(
            env, stream, part.start, part.end, fail_on_data_loss=fail_on_data_loss, what="the rabbitmq_stream source",
            columns=columns, loss_hint="option failOnDataLoss=false skips them with a warning")]

    return iter(run_with_environment(connection, work))


def _arrow_schema(decode: bool) -> Any:
    """:data:`SCHEMA` (or :data:`AMQP_SCHEMA`) in Arrow, as PySpark checks a batch ``read()`` yields: equal to
    its own conversion of the source's schema (every field nullable)."""
    pa, _ = arrow()
    fields = [("stream", pa.string()), ("offset", pa.int64()), ("timestamp", pa.int64()), ("body", pa.binary())]
    return pa.schema(fields + ([("routing_key", pa.string())] if decode else []))


def offsets_behind(progress: Any) -> dict[str, int]:
    """Per stream, how many offsets a micro-batch's end was behind the stream's end when the batch was
    planned: ``latestOffset - endOffset`` of each source of ``progress`` (``query.lastProgress``, a
    ``StreamingQueryProgress`` or its dict) whose offsets are ``{stream: offset}``, as this source's are.
    Needs ``latestOffset`` in the progress (PySpark 4.2+ asks ``reportLatestOffset``); empty without."""
    sources = progress.get("sources") if isinstance(progress, dict) else getattr(progress, "sources", None)
    behind: dict[str, int] = {}
    for source in sources or ():
        end, latest = (_offsets(source.get(key) if isinstance(source, dict) else getattr(source, key, None))
                       for key in ("endOffset", "latestOffset"))
        for stream, offset in latest.items():
            if stream in end:
                behind[stream] = max(offset - end[stream], 0)
    return behind


def _offsets(value: Any) -> dict[str, int]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


class _BatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.reading = _Reading.of(options)
        connection, streams = self.reading.connection, self.reading.streams
        self.start = _resolve(options.get("startingoffsets"), "earliest", streams, connection)
        self.end = _resolve(options.get("endingoffsets"), "latest", streams, connection)

    def partitions(self) -> Sequence[InputPartition]:
        return self.reading.partitions(self.start, self.end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.reading.read(partition)


class _StreamReader(DataSourceStreamReader):
    """Spark keeps one instance per query in a long-lived Python process on the driver, and calls
    ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` on it; ``read`` runs on executors.

    ``latestOffset`` takes ``start`` and ``limit`` as optional parameters: PySpark 4.0 and 4.1 call it
    without them, and 4.2+ sees the parameters and then asks ``getDefaultReadLimit()`` and passes them.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.reading = _Reading.of(options)
        self.connection, self.streams = self.reading.connection, self.reading.streams
        self.max_per_trigger = _int_option(options, "maxrecordspertrigger", None)
        self.max_bytes = _int_option(options, "maxbytespertrigger", None)
        self.min_per_trigger = _int_option(options, "minoffsetspertrigger", None)
        self.max_delay = duration_seconds("maxTriggerDelay", options.get("maxtriggerdelay", "15m"))
        for name, value, limit in (("maxRecordsPerTrigger", self.max_per_trigger, "ReadMaxRows"),
                                   ("maxBytesPerTrigger", self.max_bytes, "ReadMaxBytes"),
                                   ("minOffsetsPerTrigger", self.min_per_trigger, "ReadMinRows")):
            if value is not None:
                _require_admission_control(name, limit)
        self.starting = options.get("startingoffsets", "earliest")
        self.latest: dict[str, int] | None = None  # where the streams ended at the last latestOffset
        self.available_now: dict[str, int] | None = None  # Trigger.AvailableNow: where the query stops
        self.last_batch: float | None = None  # (monotonic) the last trigger minOffsetsPerTrigger did not hold
        self.sizes: dict[str, float] = {}  # maxBytesPerTrigger: each stream's last sampled record size
        self.sampled: dict[str, int] = {}  # ... and the offset it was sampled at

    def initialOffset(self) -> dict[str, int]:
        return _resolve(self.starting, "earliest", self.streams, self.connection)

    def getDefaultReadLimit(self) -> Any:
        """The limit Spark hands back to ``latestOffset`` on each trigger (PySpark 4.2+ only; Spark passes
        ``ReadAllAvailable`` instead under ``Trigger.Once``): ``ReadMaxRows``, else ``ReadMaxBytes``, else
        ``ReadMinRows`` from the options (a limit of PySpark's is one kind only; ``latestOffset`` applies
        every option given), or ``ReadAllAvailable``."""
        limits = read_limits()
        assert limits is not None, "only PySpark 4.2+ asks for a default read limit, and it has the limits"
        if self.max_per_trigger is not None:
            return limits.ReadMaxRows(self.max_per_trigger)
        if self.max_bytes is not None:
            return limits.ReadMaxBytes(self.max_bytes)
        if self.min_per_trigger is not None:
            return limits.ReadMinRows(self.min_per_trigger)
        return limits.ReadAllAvailable()

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """Where the next micro-batch ends: where the streams end now, capped by ``maxRecordsPerTrigger``
        and ``maxBytesPerTrigger`` (:func:`~smartclient.spark.admission.cap_batch_end`); or ``start``
        itself (no batch yet) while ``minOffsetsPerTrigger`` holds it back
        (:func:`~smartclient.spark.admission.hold_batch`).  Under ``ReadAllAvailable`` (``Trigger.Once``)
        nothing is capped; under ``Trigger.AvailableNow`` nothing is held back.  Spark logs the answer
        before the batch runs and replays exactly that range after a failure."""
        latest = self.latest = next_offsets(self.connection, self.streams)
        if self.available_now is not None:
            latest = {stream: min(offset, self.available_now.get(stream, offset)) for stream, offset in latest.items()}
        if start is None or not any(hasattr(limit, attr) for attr in ("max_rows", "max_bytes", "min_rows")):
            return latest  # PySpark 4.0/4.1 (no start), or ReadAllAvailable
        first = {stream: int(offset) for stream, offset in start.items()}
        max_rows = self.max_per_trigger or getattr(limit, "max_rows", None)
        max_bytes = self.max_bytes or getattr(limit, "max_bytes", None)
        min_rows = self.min_per_trigger or getattr(limit, "min_rows", None)
        now = time.monotonic()
        if min_rows is not None and self.available_now is None:
            since = None if self.last_batch is None else now - self.last_batch
            if hold_batch(first, latest, int(min_rows), since, self.max_delay):
                return {**first, **{stream: offset for stream, offset in latest.items() if stream not in first}}
        self.last_batch = now  # (as Kafka's source: the delay runs from the last trigger not held back)
        sizes = self._sizes(first, latest) if max_bytes is not None else None
        return cap_batch_end(first, latest, None if max_rows is None else int(max_rows),
                             max_bytes=None if max_bytes is None else int(max_bytes), record_bytes=sizes)

    def _sizes(self, start: dict[str, int], latest: dict[str, int]) -> dict[str, float]:
        """Each stream's record size where its next batch starts, sampled again when that moved."""
        due = {stream: offset for stream, offset in start.items()
               if latest.get(stream, offset) > offset and self.sampled.get(stream) != offset}
        if due:
            sampled = record_bytes(self.connection, due, {s: latest[s] - offset for s, offset in due.items()})
            self.sizes.update(sampled)
            self.sampled.update({stream: due[stream] for stream in sampled})  # the others: again next time
        return self.sizes

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow`` (PySpark 4.2+): the query ends where the streams end now, in batches
        capped by ``maxRecordsPerTrigger`` as usual (without this, Spark reads it all in one batch)."""
        self.available_now = next_offsets(self.connection, self.streams)

    def reportLatestOffset(self) -> dict[str, int] | None:
        """Where the streams ended when ``latestOffset`` last looked, for the query's progress (4.2+)."""
        return self.latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return self.reading.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self.reading.read(partition)

    def commit(self, end: dict[str, int]) -> None:
        return None  # nothing to release: offsets live in Spark's checkpoint


_limits = read_limits()
if _limits is not None and admission_control_supported():  # the mixin is an ABC that Spark checks with isinstance
    _limits.SupportsTriggerAvailableNow.register(_StreamReader)


class RabbitStreamDataSource(DataSource):
    """Register with ``spark.dataSource.register(RabbitStreamDataSource)``; format ``rabbitmq_stream``: a reader
    (this module) and writers for ``df.write`` and ``df.writeStream`` (:mod:`smartclient.spark.writer`)."""

    @classmethod
    def name(cls) -> str:
        return "rabbitmq_stream"

    def schema(self) -> str:
        return AMQP_SCHEMA if _decode_option(_options(self.options)) else SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(_options(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(_options(self.options))

    def writer(self, schema: Any, overwrite: bool) -> Any:
        """``df.write.format("rabbitmq_stream")``: see :mod:`smartclient.spark.writer`."""
        from smartclient.spark.writer import batch_writer

        return batch_writer(_options(self.options), schema.fieldNames(), overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        """``df.writeStream.format("rabbitmq_stream")``: see :mod:`smartclient.spark.writer`."""
        from smartclient.spark.writer import stream_writer

        return stream_writer(_options(self.options), schema.fieldNames(), overwrite)
