"""Stream arguments, offset specs and super-stream hash routing: pure, checked against other clients."""

from __future__ import annotations

import datetime as dt

import pytest

from smartclient import ConfigurationError, OffsetSpec, StreamArguments, hash_partition
from smartclient.core.routing import _murmur3_32_py, murmur3_32

# From the other clients' own tests: rabbitmq-stream-java-client HashRoutingStrategyTest and
# rabbitmq-stream-go-client super_stream_producer_test.go ("Partitioning using Murmur3"), 3 partitions.
REFERENCE_ROUTES = {
    "hello1": "invoices-02", "hello2": "invoices-01", "hello3": "invoices-02", "hello4": "invoices-03",
    "hello5": "invoices-01", "hello6": "invoices-03", "hello7": "invoices-01", "hello8": "invoices-02",
    "hello9": "invoices-01", "hello10": "invoices-03", "hello88": "invoices-02",  # hello88: Go only
}
PARTITIONS = ["invoices-01", "invoices-02", "invoices-03"]


@pytest.mark.parametrize("key, partition", sorted(REFERENCE_ROUTES.items()))
def test_hash_routing_matches_the_java_and_go_clients(key: str, partition: str) -> None:
    assert hash_partition(key, PARTITIONS) == partition


def test_pure_python_murmur3_matches_mmh3() -> None:
    for data in (b"", b"a", b"ab", b"abc", b"abcd", "clé-ünïcode".encode(), bytes(range(256))):
        assert _murmur3_32_py(data, 104729) == murmur3_32(data)


def test_rstream_routing_is_incompatible() -> None:
    import mmh3

    def rstream_route(key: str) -> int:  # rstream 1.1.1 HashRoutingMurmurStrategy
        return int.from_bytes(mmh3.hash_bytes(bytes(key, "UTF-16"), 104729), "little", signed=False) % 3

    differ = sum(rstream_route(f"key-{i}") != PARTITIONS.index(hash_partition(f"key-{i}", PARTITIONS))
                 for i in range(1000))
    assert 600 < differ < 720  # about two keys in three land elsewhere


def test_stream_arguments_render_per_protocol() -> None:
    args = StreamArguments(max_length_bytes=20_000_000_000, max_age="7D", max_segment_size_bytes=100_000_000,
                           filter_size_bytes=32, initial_cluster_size=3, leader_locator="balanced")
    assert args.to_stream_protocol() == {
        "max-length-bytes": "20000000000", "max-age": "7D", "stream-max-segment-size-bytes": "100000000",
        "stream-filter-size-bytes": "32", "initial-cluster-size": "3", "queue-leader-locator": "balanced"}
    amqp = args.to_amqp()
    assert amqp["x-queue-type"] == "stream" and amqp["x-max-age"] == "7D" and amqp["x-max-length-bytes"] == 20e9
    assert StreamArguments.coerce({"x-max-age": "12h", "initial-cluster-size": 2, "filter_size_bytes": 16}) == \
        StreamArguments(max_age="12h", initial_cluster_size=2, filter_size_bytes=16)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_age": "7d"}, "one of Y M D h m s"), ({"max_age": "0D"}, "must be positive"),
    ({"max_age": "7 days"}, "one of Y M D h m s"), ({"max_segment_size_bytes": 3_000_000_001}, "from 1 to"),
    ({"filter_size_bytes": 15}, "from 16 to 255"), ({"filter_size_bytes": 256}, "from 16 to 255"),
    ({"initial_cluster_size": 0}, "a positive int"), ({"max_length_bytes": -1}, "a positive int"),
    ({"max_length_bytes": "10"}, r"not '10' \(a str\)"), ({"initial_cluster_size": True}, r"not True \(a bool\)"),
    ({"leader_locator": "random"}, "must be one of"),
])
def test_bad_stream_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        StreamArguments(**kwargs)  # type: ignore[arg-type]


def test_unknown_argument_keys_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown stream argument 'x-queue-mode'.*would ignore"):
        StreamArguments.coerce({"x-queue-mode": "lazy"})


@pytest.mark.parametrize("key", ["x-max-length", "max-age-seconds", "x-initial-cluster-sise", "initialClusterSize"])
def test_the_unknown_keys_docs_streams_names_are_refused(key: str) -> None:
    with pytest.raises(ConfigurationError, match=f"unknown stream argument {key!r}"):
        StreamArguments.coerce({key: 1})


@pytest.mark.parametrize("key", ["initial_cluster_size", "initial-cluster-size", "x-initial-cluster-size"])
def test_every_spelling_of_a_known_key_is_accepted_and_sent_in_each_protocols_form(key: str) -> None:
    """docs/streams.md: ``{"x-initial-cluster-size": 2}`` is accepted, and reaches the stream protocol
    without its ``x-`` (the broker would drop it with one)."""
    args = StreamArguments.coerce({key: 2})
    assert args == StreamArguments(initial_cluster_size=2)
    assert args.to_stream_protocol() == {"initial-cluster-size": "2"}
    assert args.to_amqp() == {"x-queue-type": "stream", "x-initial-cluster-size": 2}


def test_offset_specs() -> None:
    assert OffsetSpec.parse("first") == OffsetSpec.first() and OffsetSpec.parse(42) == OffsetSpec.at(42)
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    spec = OffsetSpec.parse(when)
    assert spec.kind == "timestamp" and spec.timestamp_ms() == 1767225600000
    assert OffsetSpec.parse(dt.datetime(2026, 1, 1)) == spec  # naive means UTC
    interval = OffsetSpec.parse("1h")
    assert interval.timestamp_ms(now=10_000.0) == (10_000 - 3600) * 1000
    assert interval.to_amqp() == "1h" and OffsetSpec.at(5).to_amqp() == 5 and OffsetSpec.next().to_amqp() == "next"


@pytest.mark.parametrize("value, message", [
    (-1, "non-negative"), (True, "is a bool"), ("1 hour", "one of Y M D h m s"), (1.5, "must be 'first'"),
    ("FIRST", "one of Y M D h m s"),
])
def test_bad_offsets(value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        OffsetSpec.parse(value)


def test_stream_stats_frames() -> None:
    import struct

    from smartclient import StreamNotFound
    from smartclient.stream.stats import decode_stream_stats, encode_stream_stats

    request = encode_stream_stats(7, "s1")
    assert request == struct.pack(">IHHIh", 12, 0x1C, 1, 7, 2) + b"s1"
    body = struct.pack(">HHIHi", 0x801C, 1, 7, 1, 2)
    for name, value in (("first_chunk_id", 0), ("committed_chunk_id", 42)):
        body += struct.pack(">h", len(name)) + name.encode() + struct.pack(">q", value)
    assert decode_stream_stats(body, "s1") == {"first_chunk_id": 0, "committed_chunk_id": 42}
    with pytest.raises(StreamNotFound):
        decode_stream_stats(struct.pack(">HHIHi", 0x801C, 1, 7, 2, 0), "s1")


def test_an_offset_spec_knows_its_start_only_when_it_is_absolute() -> None:
    from smartclient import OffsetSpec

    assert (OffsetSpec.at(42).start, OffsetSpec.first().start) == (42, 0)
    assert OffsetSpec.next().start is None and OffsetSpec.last().start is None and OffsetSpec.parse("1h").start is None
