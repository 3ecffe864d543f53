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
* streaming: ``startingOffsets`` (``earliest``, default, or ``latest``).  ``maxRecordsPerTrigger`` is
  refused with a clear error on PySpark 4.0, whose Python stream readers get no admission-control
  hook (their ``latestOffset()`` receives neither the start nor a limit).

Readers run on the executors and are placed on replicas like any smartclient consumer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from smartclient._errors import ConfigurationError
from smartclient.core.address import Address
from smartclient.spark.config import StreamConnection
from smartclient.spark.runtime import run_with_environment
from smartclient.stream.codec import decode_amqp

__all__ = ["RabbitStreamDataSource", "next_offsets"]

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
    """The offset the next message of ``stream`` will get.

    StreamStats says whether the stream holds anything (``committed_chunk_id`` is -1 when it is empty)
    and where its last committed chunk starts; reading from there shows where that chunk ends.  A
    replica that lags only delays the answer: it is never mistaken for an empty stream.

    :raises TopologyError: the last chunk could not be read within ``wait`` seconds.
    """
    from smartclient._errors import TopologyError
    from smartclient.core.offsets import OffsetSpec

    stats = await env.stream_stats(stream)
    last_chunk = int(stats.get("committed_chunk_id", -1))
    if last_chunk < 0:
        return 0  # empty
    # A read that shows nothing for a while is tried again on a fresh placement: a subscription that
    # never delivers was seen (rarely) in Spark's long-lived source process, and waiting longer did not help.
    deadline = time.monotonic() + wait
    tried: list[str] = []
    while True:
        consumer = await env.consumer(stream, lambda message, context: None, offset=OffsetSpec.at(last_chunk))
        try:
            until = min(deadline, time.monotonic() + 5.0)
            while consumer.last_offset is None and time.monotonic() < until:
                await asyncio.sleep(0.01)
            last = consumer.last_offset
            tried.append(str(consumer.node))
        finally:
            await consumer.close()
        if last is not None:
            return int(last) + 1
        if time.monotonic() >= deadline:
            raise TopologyError(
                f"the last chunk of {stream!r} (offset {last_chunk}) could not be read within {wait} s "
                f"(tried on {', '.join(tried)})"
            )
        log.warning("reading the last chunk of %r at %d on %s showed nothing in 5 s: trying again",
                    stream, last_chunk, tried[-1])
        env.invalidate(stream)


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


def admission_control_supported() -> bool:
    """Whether this PySpark lets a Python stream reader cap a micro-batch (latestOffset(start, limit))."""
    import inspect

    return len(inspect.signature(DataSourceStreamReader.latestOffset).parameters) > 1


def _split(start: dict[str, int], end: dict[str, int], size: int) -> list[OffsetRange]:
    parts = []
    for stream, first in start.items():
        last = end.get(stream, first)
        for lo in range(first, last, size):
            parts.append(OffsetRange(stream, lo, min(lo + size, last)))
    return parts


def _read(connection: StreamConnection, partition: InputPartition, decode: bool = False) -> Iterator[Row]:
    if not isinstance(partition, OffsetRange):
        raise ConfigurationError(f"unexpected partition {partition!r} for the rabbitmq_stream source")
    part = partition
    if part.end <= part.start:
        return iter(())

    async def work(env: Any) -> list[Row]:
        from smartclient.core.offsets import OffsetSpec

        rows: list[Row] = []
        done = asyncio.Event()

        def on_message(message: Any, context: Any) -> None:
            if part.start <= context.offset < part.end:
                if decode:
                    body, key = decode_amqp(bytes(message), f"offset {context.offset} of stream {part.stream!r}")
                    rows.append((part.stream, context.offset, context.timestamp, body, key))
                else:
                    rows.append((part.stream, context.offset, context.timestamp, bytes(message)))
            if context.offset >= part.end - 1:
                done.set()

        consumer = await env.consumer(part.stream, on_message, offset=OffsetSpec.at(part.start))
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            await consumer.close()
        return rows

    return iter(run_with_environment(connection, work))


class _BatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.connection = _connection(options)
        streams = _streams(options)
        self.size = _int_option(options, "maxrecordsperpartition", 50_000) or 50_000
        self.start = _resolve(options.get("startingoffsets"), "earliest", streams, self.connection)
        self.end = _resolve(options.get("endingoffsets"), "latest", streams, self.connection)
        self.decode = _decode_option(options)

    def partitions(self) -> Sequence[InputPartition]:
        return _split(self.start, self.end, self.size)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        return _read(self.connection, partition, self.decode)


class _StreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.connection = _connection(options)
        self.streams = _streams(options)
        self.size = _int_option(options, "maxrecordsperpartition", 50_000) or 50_000
        if "maxrecordspertrigger" in options and not admission_control_supported():
            import pyspark

            raise ConfigurationError(
                f"maxRecordsPerTrigger needs admission control for Python data sources, which PySpark "
                f"{pyspark.__version__} does not offer (its latestOffset() gets no start and no limit); "
                f"split the work with maxRecordsPerPartition instead"
            )
        self.starting = options.get("startingoffsets", "earliest")
        self.decode = _decode_option(options)

    def initialOffset(self) -> dict[str, int]:
        return _resolve(self.starting, "earliest", self.streams, self.connection)

    def latestOffset(self) -> dict[str, int]:
        return next_offsets(self.connection, self.streams)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return _split(start, end, self.size)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        return _read(self.connection, partition, self.decode)

    def commit(self, end: dict[str, int]) -> None:
        return None  # nothing to release: offsets live in Spark's checkpoint


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
