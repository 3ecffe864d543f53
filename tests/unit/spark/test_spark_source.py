"""The Spark source's decisions that need no broker: how a capped micro-batch ends, how the reader
answers Spark's admission-control calls, where a stream ends with and without ``committed_offset``, how
ranges split (``minPartitions``), and how far a query lags."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import pytest

from smartclient import ConfigurationError
from smartclient.spark import source
from smartclient.spark.source import _split, admission_control_supported, cap_batch_end, offsets_behind
from smartclient.stream.columnar import next_offset as _next_offset
from tests.unit.fakes import FakeConsumer


@pytest.mark.parametrize("start, latest, cap, end", [
    ({"a": 0}, {"a": 1000}, 300, {"a": 300}),
    ({"a": 900}, {"a": 1000}, 300, {"a": 1000}),                       # less than the cap is left
    ({"a": 0, "b": 0}, {"a": 1000, "b": 1000}, 300, {"a": 150, "b": 150}),
    ({"a": 0, "b": 0}, {"a": 1000, "b": 40}, 300, {"a": 260, "b": 40}),  # b's unused share goes to a
    ({"a": 5, "b": 0}, {"a": 5, "b": 0}, 10, {"a": 5, "b": 0}),          # nothing new
    ({"a": 50}, {"a": 20}, 10, {"a": 50}),                               # never backwards
    ({"a": 0}, {"a": 100, "new": 7}, 10, {"a": 10, "new": 7}),           # a stream start lacks: its latest
])
def test_a_capped_batch_holds_at_most_the_cap_shared_over_the_streams(
    start: dict[str, int], latest: dict[str, int], cap: int, end: dict[str, int]
) -> None:
    assert cap_batch_end(start, latest, cap) == end
    assert sum(end[s] - start[s] for s in start) <= cap


def test_a_cap_that_does_not_divide_evenly_gives_the_one_left_to_whichever_stream_has_the_turn() -> None:
    end = cap_batch_end({"a": 0, "b": 0, "c": 0}, {"a": 9, "b": 9, "c": 9}, 10)
    assert sorted(end.values()) == [3, 3, 4]


def test_successive_capped_batches_reach_the_end_once() -> None:
    start, latest, sizes = {"a": 0, "b": 0}, {"a": 700, "b": 300}, []
    while start != latest:
        end = cap_batch_end(start, latest, 300)
        sizes.append(sum(end[s] - start[s] for s in start))
        start = end
    assert sizes == [300, 300, 300, 100]


def test_latest_offset_without_a_limit_is_where_the_streams_end(open_reader: Any) -> None:
    r = open_reader({"a": 1000, "b": 10})
    assert r.latestOffset() == {"a": 1000, "b": 10}  # PySpark 4.0 and 4.1 call it so
    assert r.latestOffset({"a": 0, "b": 0}, SimpleNamespace()) == {"a": 1000, "b": 10}  # ReadAllAvailable
    assert r.latestOffset({"a": 0, "b": 0}, SimpleNamespace(max_rows=100)) == {"a": 90, "b": 10}  # ReadMaxRows
    assert r.reportLatestOffset() == {"a": 1000, "b": 10}


def test_trigger_available_now_stops_where_the_streams_ended_when_it_started(
    monkeypatch: pytest.MonkeyPatch, open_reader: Any
) -> None:
    r = open_reader({"a": 500, "b": 10})
    r.prepareForTriggerAvailableNow()
    monkeypatch.setattr(source, "next_offsets", lambda connection, streams: {"a": 900, "b": 20})  # more arrived
    assert r.latestOffset({"a": 0, "b": 0}, SimpleNamespace()) == {"a": 500, "b": 10}
    assert r.latestOffset({"a": 400, "b": 10}, SimpleNamespace(max_rows=300)) == {"a": 500, "b": 10}
    assert r.reportLatestOffset() == {"a": 900, "b": 20}


@pytest.mark.skipif(not admission_control_supported(), reason="this PySpark has no admission control")
def test_the_default_read_limit_is_max_records_per_trigger(open_reader: Any) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # type: ignore[import-not-found,unused-ignore]

    assert open_reader({}, maxRecordsPerTrigger="300").getDefaultReadLimit() == ReadMaxRows(300)
    assert open_reader({}).getDefaultReadLimit() == ReadAllAvailable()
    with pytest.raises(ConfigurationError, match="must be positive"):
        open_reader({}, maxRecordsPerTrigger="0")


@pytest.mark.skipif(not admission_control_supported(), reason="this PySpark has no admission control")
def test_spark_sees_admission_control_and_trigger_available_now(open_reader: Any) -> None:
    import io

    from pyspark.sql.streaming import python_streaming_source_runner as runner  # type: ignore[attr-defined,unused-ignore]

    out = io.BytesIO()
    runner.check_support_func(open_reader({}), out)  # what Spark's source process answers the JVM
    flags = int.from_bytes(out.getvalue(), "big")
    assert flags == runner.SUPPORTS_ADMISSION_CONTROL | runner.SUPPORTS_TRIGGER_AVAILABLE_NOW


def test_max_records_per_trigger_is_refused_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, open_reader: Any
) -> None:
    import pyspark

    # a PySpark without the hook (4.0, 4.1), whichever PySpark is installed
    monkeypatch.setattr(source, "admission_control_supported", lambda: False)
    refused = rf"PySpark {pyspark.__version__} does not offer .* came in PySpark 4\.2"
    with pytest.raises(ConfigurationError, match=refused):
        open_reader({}, maxRecordsPerTrigger="300")


class FakeEnvironment:
    """``stream_stats`` answers ``stats``; a consumer sees the last chunk end at ``chunk_ends_at``."""

    def __init__(self, stats: dict[str, int], chunk_ends_at: int | None = None) -> None:
        self.stats, self.chunk_ends_at = stats, chunk_ends_at
        self.subscribed: list[Any] = []

    async def stream_stats(self, stream: str) -> dict[str, int]:
        return self.stats

    async def consumer(self, stream: str, callback: Any, options: Any) -> FakeConsumer:
        self.subscribed.append(options.offset)
        return FakeConsumer(last_offset=self.chunk_ends_at, node="n1")

    def invalidate(self, stream: str) -> None:
        pass


@pytest.mark.parametrize("stats, end", [
    ({"committed_chunk_id": 96, "committed_offset": 99, "first_chunk_id": 0, "last_chunk_id": 96}, 100),
    ({"committed_chunk_id": -1, "committed_offset": -1, "first_chunk_id": -1, "last_chunk_id": -1}, 0),
])
def test_the_end_is_committed_offset_plus_one_where_the_broker_reports_it(stats: dict[str, int], end: int) -> None:
    env = FakeEnvironment(stats)
    assert asyncio.run(_next_offset(env, "s")) == end
    assert env.subscribed == []  # nothing read


def test_without_committed_offset_the_end_is_read_from_the_last_chunk() -> None:
    from smartclient.core.offsets import OffsetSpec

    env = FakeEnvironment({"committed_chunk_id": 96, "first_chunk_id": 0, "last_chunk_id": 96}, chunk_ends_at=99)
    assert asyncio.run(_next_offset(env, "s")) == 100
    assert env.subscribed == [OffsetSpec.at(96)]
    empty = FakeEnvironment({"committed_chunk_id": -1, "first_chunk_id": -1, "last_chunk_id": -1})
    assert asyncio.run(_next_offset(empty, "s")) == 0 and empty.subscribed == []


def test_min_partitions_cuts_the_ranges_in_proportion_and_covers_each_offset_once() -> None:
    start, end = {"a": 0, "b": 100, "c": 5}, {"a": 900, "b": 200, "c": 5}
    assert len(_split(start, end, 50_000)) == 2  # one piece per non-empty stream without it
    parts = _split(start, end, 50_000, min_partitions=10)
    assert len(parts) >= 10
    assert len([p for p in parts if p.stream == "a"]) == 9 and len([p for p in parts if p.stream == "b"]) == 1
    for stream in ("a", "b"):
        covered = [o for p in parts if p.stream == stream for o in range(p.start, p.end)]
        assert covered == list(range(start[stream], end[stream]))
    assert _split(start, end, 50_000, min_partitions=10) == parts  # the same offsets, the same partitions
    assert len(_split({"a": 0}, {"a": 3}, 50_000, min_partitions=10)) == 3  # never an empty piece
    assert _split({"a": 0}, {"a": 100}, 20, min_partitions=2) == _split({"a": 0}, {"a": 100}, 20)


def test_offsets_behind_reads_latest_minus_end_from_a_query_progress() -> None:
    progress = {"sources": [
        {"description": "rabbitmq_stream", "endOffset": '{"a": 10, "b": 7}', "latestOffset": '{"a": 25, "b": 7}'},
        {"description": "kafka", "endOffset": {"t": {"0": 5}}, "latestOffset": {"t": {"0": 9}}},
    ]}
    assert offsets_behind(progress) == {"a": 15, "b": 0}
    assert offsets_behind({"sources": [{"endOffset": '{"a": 1}', "latestOffset": None}]}) == {}
    assert offsets_behind(None) == {}


@pytest.mark.parametrize("value, error", [("maybe", "failOnDataLoss='maybe': use 'true' or 'false'"),
                                          ("0", "minPartitions=0 must be positive")])
def test_bad_source_options_are_refused_by_name(value: str, error: str) -> None:
    from smartclient.spark.source import _Reading

    name = "failOnDataLoss" if "failOnDataLoss" in error else "minPartitions"
    options = {"uri": "rabbitmq-stream://u:p@lb:5552/", "streams": "a", name.lower(): value}
    with pytest.raises(ConfigurationError, match=re.escape(error)):
        _Reading.of(options)
    assert _Reading.of({"uri": "rabbitmq-stream://u:p@lb:5552/", "streams": "a"}).fail_on_data_loss is True
