"""``RabbitStreamDataSource``: streams as a Spark source, through the Python Data Source API (PySpark 4.0+).

    spark.dataSource.register(RabbitStreamDataSource)
    df = (spark.read.format("rabbitmq_stream")            # or spark.readStream
          .option("uri", "rabbitmq-stream://user:pw@lb:5552/").option("loadBalancer", "lb:5552")
          .option("streams", "orders,payments").load())

Rows: ``stream`` string, ``offset`` long, ``timestamp`` long (the chunk's, in ms), ``body`` binary.
Offsets are ``{stream: next offset}``.  Options:

* ``decode``: ``none`` (default: ``body`` is the message as stored) or ``amqp``: each message is an AMQP
  1.0 message (what RabbitMQ stores for MQTT and AMQP 0.9.1 publishers, and for rstream's
  ``AMQPMessage``), decoded by rstream; ``body`` is its body, and a ``routing_key`` string column holds
  the ``x-routing-key`` annotation (for MQTT: the topic, ``/`` turned into ``.``);

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
* streaming: ``startingOffsets`` (``earliest``, default, or ``latest``); ``maxRecordsPerTrigger``: each
  micro-batch ends at most that many records past its start, summed over ``streams`` (shared out
  evenly, what one stream leaves unused going to the others).  It needs PySpark 4.2+, which gives
  Python stream readers admission control (``latestOffset(start, limit)`` and
  ``getDefaultReadLimit()``); on 4.0 and 4.1 the option is refused with a clear error.  On 4.2+
  ``Trigger.AvailableNow`` stops where the streams end when the query starts, in capped batches.

How far a query lags: :func:`offsets_behind` of ``query.lastProgress`` gives, per stream, how many
offsets the batch's end was behind the stream's end when the batch was planned (``reportLatestOffset``,
PySpark 4.2+; Python sources cannot report custom source metrics).

A stream's end comes from StreamStats: ``committed_offset`` + 1 where the broker reports it
(RabbitMQ 4.3); otherwise (4.0) it is inferred by reading the last committed chunk.

Readers run on the executors and are placed on replicas like any smartclient consumer.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from smartclient._errors import ConfigurationError, DataLoss
from smartclient.core.address import Address
from smartclient.core.delivery import Chunk
from smartclient.spark.config import StreamConnection
from smartclient.spark.runtime import run_with_environment
from smartclient.stream.codec import decode_amqp

__all__ = ["RabbitStreamDataSource", "admission_control_supported", "cap_batch_end", "next_offsets", "offsets_behind"]

log = logging.getLogger(__name__)

SCHEMA = "stream string, offset long, timestamp long, body binary"
AMQP_SCHEMA = SCHEMA + ", routing_key string"
Row = tuple[Any, ...]


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
    uri = options.get("uri")
    if not uri:
        raise ConfigurationError("the rabbitmq_stream source needs option('uri', 'rabbitmq-stream://...')")
    resolver = None
    if options.get("loadbalancer"):
        from resolvers import LoadBalancer

        resolver = LoadBalancer(Address.parse(options["loadbalancer"]))
    return StreamConnection(uri, resolver=resolver)


def _streams(options: dict[str, str]) -> list[str]:
    streams = [s.strip() for s in options.get("streams", "").split(",") if s.strip()]
    if not streams:
        raise ConfigurationError("the rabbitmq_stream source needs option('streams', 'a,b')")
    return streams


def _bool_option(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigurationError(f"option {name}={raw!r}: use 'true' or 'false'")
    return value == "true"


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
                   _bool_option(options, "failondataloss", True))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[OffsetRange]:
        return _split(start, end, self.size, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        return _read(self.connection, partition, self.decode, self.fail_on_data_loss)


def _int_option(options: dict[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"option {name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigurationError(f"option {name}={value} must be positive")
    return value


async def _next_offset(env: Any, stream: str, wait: float = 30.0) -> int:
    """The offset the next message of ``stream`` will get: ``committed_offset`` + 1 from StreamStats
    where the broker reports it (RabbitMQ 4.3), otherwise inferred by reading the last committed chunk.

    :raises TopologyError: (without ``committed_offset``) the last chunk could not be read within
        ``wait`` seconds.
    """
    stats = await env.stream_stats(stream)
    if "committed_offset" in stats:
        return max(int(stats["committed_offset"]) + 1, 0)  # -1 when the stream is empty
    return await _next_offset_by_reading(env, stream, int(stats.get("committed_chunk_id", -1)), wait)


async def _next_offset_by_reading(env: Any, stream: str, last_chunk: int, wait: float) -> int:
    """Brokers before 4.3 report where the last committed chunk starts (``committed_chunk_id``, -1 when
    the stream is empty), not where it ends: read from there to see its last offset.  A replica that
    lags only delays the answer: it is never mistaken for an empty stream.

    (A read that showed nothing was once tried again after 5 s.  The cause was the consumer's
    ``last_offset`` missing a first chunk handed over before ``subscribe()`` returned; it is fixed in the
    rstream seam, so one read is waited for.)"""
    from smartclient._errors import TopologyError
    from smartclient.core.offsets import OffsetSpec

    if last_chunk < 0:
        return 0  # empty
    consumer = await env.consumer(stream, lambda message, context: None, offset=OffsetSpec.at(last_chunk))
    try:
        deadline = time.monotonic() + wait
        while consumer.last_offset is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        last, node = consumer.last_offset, consumer.node
    finally:
        await consumer.close()
    if last is None:
        raise TopologyError(f"the last chunk of {stream!r} (offset {last_chunk}) could not be read within {wait} s "
                            f"(on {node})")
    return int(last) + 1


def next_offsets(connection: StreamConnection, streams: Sequence[str]) -> dict[str, int]:
    """``{stream: next offset}`` for each stream: where each stream ends now."""

    async def work(env: Any) -> dict[str, int]:
        return {stream: await _next_offset(env, stream) for stream in streams}

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


def admission_control_supported() -> bool:
    """Whether this PySpark gives Python stream readers admission control: 4.2 added
    ``DataSourceStreamReader.latestOffset(start, limit)``, ``getDefaultReadLimit()`` and ``ReadMaxRows``."""
    try:
        limits = importlib.import_module("pyspark.sql.streaming.datasource")
    except ImportError:
        return False
    return hasattr(limits, "ReadMaxRows") and hasattr(DataSourceStreamReader, "getDefaultReadLimit")


def cap_batch_end(start: dict[str, int], latest: dict[str, int], max_records: int) -> dict[str, int]:
    """The end of a micro-batch that starts at ``start`` and may reach ``latest``, holding at most
    ``max_records`` records over all streams.

    The budget is shared out evenly and what a stream cannot use goes to the others, in the order of
    ``start``; the answer depends on its arguments only.  No stream goes back: one whose latest offset
    is behind its start (a stream deleted and created again) stays where it is.  A stream that
    ``start`` does not have is given its latest offset, as an uncapped batch would.
    """
    room = {stream: max(latest.get(stream, first) - first, 0) for stream, first in start.items()}
    take = dict.fromkeys(room, 0)
    budget = max_records
    hungry = [stream for stream, free in room.items() if free > 0]
    while budget > 0 and hungry:
        share = max(budget // len(hungry), 1)
        for stream in hungry:
            got = min(share, room[stream] - take[stream], budget)
            take[stream] += got
            budget -= got
        hungry = [stream for stream in hungry if take[stream] < room[stream]]
    end = {stream: first + take[stream] for stream, first in start.items()}
    return {**latest, **end}


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
          fail_on_data_loss: bool = True) -> Iterator[Row]:
    if not isinstance(partition, OffsetRange):
        raise ConfigurationError(f"unexpected partition {partition!r} for the rabbitmq_stream source")
    part = partition
    if part.end <= part.start:
        return iter(())

    async def work(env: Any) -> list[Row]:
        from smartclient.core.offsets import OffsetSpec

        rows: list[Row] = []
        done = asyncio.Event()
        first: list[int] = []  # the first offset delivered: after part.start only if retention removed it
        stream = part.stream

        def on_chunk(chunk: Chunk) -> None:  # a chunk at a time: the first user of the chunk API (issue 21)
            if not first:
                first.append(chunk.first_offset)
            start, end, timestamp = part.start, part.end, chunk.timestamp
            for offset, body in chunk:
                if offset >= end:
                    break
                if offset >= start:
                    if decode:
                        value, key = decode_amqp(body, f"offset {offset} of stream {stream!r}")
                        rows.append((stream, offset, timestamp, value, key))
                    else:
                        rows.append((stream, offset, timestamp, body))
            if chunk.last_offset >= end - 1:
                done.set()

        consumer = await env.consumer(stream, on_chunk=on_chunk, offset=OffsetSpec.at(part.start))
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            await consumer.close()
        if first and first[0] > part.start:
            _lost(part, min(first[0], part.end), fail_on_data_loss)
        return rows

    return iter(run_with_environment(connection, work))


def _lost(part: OffsetRange, end: int, fail: bool) -> None:
    what = (f"offsets {part.start} to {end - 1} of stream {part.stream!r} are gone: retention removed them "
            f"before they were read")
    if fail:
        raise DataLoss(f"{what} (option failOnDataLoss=false skips them with a warning)", part.stream, part.start, end)
    log.warning("%s; skipped (failOnDataLoss=false)", what)


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

    def read(self, partition: InputPartition) -> Iterator[Row]:
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
        if self.max_per_trigger is not None and not admission_control_supported():
            import pyspark

            raise ConfigurationError(
                f"maxRecordsPerTrigger needs admission control for Python data sources, which PySpark "
                f"{pyspark.__version__} does not offer (it came in PySpark {ADMISSION_CONTROL_SINCE}: before, "
                f"latestOffset() gets no start and no limit); split the work with maxRecordsPerPartition instead"
            )
        self.starting = options.get("startingoffsets", "earliest")
        self.latest: dict[str, int] | None = None  # where the streams ended at the last latestOffset
        self.available_now: dict[str, int] | None = None  # Trigger.AvailableNow: where the query stops

    def initialOffset(self) -> dict[str, int]:
        return _resolve(self.starting, "earliest", self.streams, self.connection)

    def getDefaultReadLimit(self) -> Any:
        """``ReadMaxRows(maxRecordsPerTrigger)``, or ``ReadAllAvailable()`` (PySpark 4.2+ only)."""
        limits = importlib.import_module("pyspark.sql.streaming.datasource")
        if self.max_per_trigger is None:
            return limits.ReadAllAvailable()
        return limits.ReadMaxRows(self.max_per_trigger)

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """Where the next micro-batch ends: where the streams end now, or, under a ``ReadMaxRows``
        limit, at most ``limit.max_rows`` records past ``start`` (:func:`cap_batch_end`).  Spark logs
        the answer before the batch runs and replays exactly that range after a failure."""
        latest = self.latest = next_offsets(self.connection, self.streams)
        if self.available_now is not None:
            latest = {stream: min(offset, self.available_now.get(stream, offset)) for stream, offset in latest.items()}
        max_rows = getattr(limit, "max_rows", None)  # ReadAllAvailable (Trigger.AvailableNow, Once) has none
        if start is None or max_rows is None:
            return latest
        return cap_batch_end({s: int(o) for s, o in start.items()}, latest, int(max_rows))

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow`` (PySpark 4.2+): the query ends where the streams end now, in batches
        capped by ``maxRecordsPerTrigger`` as usual (without this, Spark reads it all in one batch)."""
        self.available_now = next_offsets(self.connection, self.streams)

    def reportLatestOffset(self) -> dict[str, int] | None:
        """Where the streams ended when ``latestOffset`` last looked, for the query's progress (4.2+)."""
        return self.latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return self.reading.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        return self.reading.read(partition)

    def commit(self, end: dict[str, int]) -> None:
        return None  # nothing to release: offsets live in Spark's checkpoint


if admission_control_supported():  # the mixin is an ABC that Spark checks with isinstance
    importlib.import_module("pyspark.sql.streaming.datasource").SupportsTriggerAvailableNow.register(_StreamReader)


class RabbitStreamDataSource(DataSource):
    """Register with ``spark.dataSource.register(RabbitStreamDataSource)``; format ``rabbitmq_stream``."""

    @classmethod
    def name(cls) -> str:
        return "rabbitmq_stream"

    def schema(self) -> str:
        return AMQP_SCHEMA if _decode_option(_options(self.options)) else SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(_options(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(_options(self.options))
