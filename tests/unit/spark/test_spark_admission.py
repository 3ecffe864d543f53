"""The source's admission control without Spark or a broker: byte caps from sampled record sizes,
``minOffsetsPerTrigger`` with ``maxTriggerDelay``, and how the stream reader answers Spark with them."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from smartclient import ConfigurationError
from smartclient.spark import source
from smartclient.spark.admission import cap_batch_end, duration_seconds, hold_batch, new_records
from smartclient.spark.source import admission_control_supported
from tests.unit.fakes import Clock


@pytest.mark.parametrize("start, latest, max_bytes, sizes, end", [
    ({"a": 0}, {"a": 1000}, 250_000, {"a": 1000.0}, {"a": 250}),
    ({"a": 0}, {"a": 1000}, 250_999, {"a": 1000.0}, {"a": 250}),            # no part of a record
    ({"a": 0, "b": 0}, {"a": 400, "b": 400}, 110_000, {"a": 1000.0, "b": 100.0}, {"a": 70, "b": 400}),
    ({"a": 0, "b": 0}, {"a": 400, "b": 400}, 100_000, {"a": 1000.0, "b": 1000.0}, {"a": 50, "b": 50}),
    ({"a": 0}, {"a": 10}, 100, {"a": 5000.0}, {"a": 1}),                    # one record over the budget: alone
    ({"a": 0}, {"a": 10}, 4096, {}, {"a": 4}),                              # not sampled: 1 KiB a record
    ({"a": 5, "b": 0}, {"a": 5, "b": 0}, 10, {}, {"a": 5, "b": 0}),         # nothing new
])
def test_a_byte_capped_batch_holds_at_most_the_budget_at_the_sampled_sizes(
    start: dict[str, int], latest: dict[str, int], max_bytes: int, sizes: dict[str, float], end: dict[str, int]
) -> None:
    assert cap_batch_end(start, latest, max_bytes=max_bytes, record_bytes=sizes) == end
    taken = {s: end[s] - start[s] for s in start}
    assert sum(n * sizes.get(s, 1024.0) for s, n in taken.items()) <= max_bytes or sum(taken.values()) == 1


def test_records_and_bytes_caps_apply_together() -> None:
    start, latest = {"a": 0, "b": 0}, {"a": 1000, "b": 1000}
    assert cap_batch_end(start, latest, 300, max_bytes=10**9, record_bytes={"a": 1.0, "b": 1.0}) == {"a": 150, "b": 150}
    assert cap_batch_end(start, latest, 300, max_bytes=20_000, record_bytes={"a": 100.0, "b": 100.0}) == {
        "a": 100, "b": 100}
    # what the record cap would give b, b's bytes cannot use: a takes it (999 records, 91,909 bytes)
    end = cap_batch_end(start, latest, 1000, max_bytes=100_000, record_bytes={"a": 1.0, "b": 1000.0})
    assert end == {"a": 909, "b": 91}


def batches_until(start: dict[str, int], latest: dict[str, int], count: int, **caps: Any) -> list[dict[str, int]]:
    taken = []
    for _ in range(count):
        end = cap_batch_end(start, latest, **caps)
        taken.append({stream: end[stream] - start[stream] for stream in start})
        start = end
    return taken


def test_a_stream_of_large_records_is_not_starved_by_the_others_backlog() -> None:
    start, latest = {"big": 0, "small": 0}, {"big": 100, "small": 10**9}
    # a 600 kB record fits a 1 MB budget: it goes in every batch beside the small ones
    for batch in batches_until(start, latest, 5, max_bytes=1_000_000, record_bytes={"big": 6e5, "small": 100.0}):
        assert batch == {"big": 1, "small": 4000}
    # a 2 MB record never fits: it goes alone on its turn, and the turns come round
    batches = batches_until(start, latest, 12, max_bytes=1_000_000, record_bytes={"big": 2e6, "small": 100.0})
    assert {"big": 1, "small": 0} in batches and {"big": 0, "small": 10_000} in batches
    # more streams with new records than the record cap: every one moves in turn
    five = dict.fromkeys("abcde", 0)
    moved = {s for batch in batches_until(five, dict.fromkeys(five, 10**6), 10, max_records=2)
             for s, n in batch.items() if n}
    assert moved == set(five)


def test_sharing_many_streams_stays_cheap() -> None:
    start = {f"s{i}": 0 for i in range(1000)}
    sizes = {s: (1.0 if s == "s0" else 1e7) for s in start}
    end = cap_batch_end(start, dict.fromkeys(start, 10**9), max_bytes=int(1000 * 1e7) - 1, record_bytes=sizes)
    assert sum(end[s] * sizes[s] for s in start) <= 1000 * 1e7 - 1 and sum(1 for s in start if end[s]) >= 999
    # bytes bind, and the slack the expensive streams' rounding leaves is millions of the cheap stream's
    # records: they go in one step (they once went a record a pass: 3 million passes, seconds)
    start = {"cheap": 0, "dear": 0, "dearer": 0}
    sizes = {"cheap": 1.0, "dear": 5_639_397.0, "dearer": 6_741_949.0}
    end = cap_batch_end(start, dict.fromkeys(start, 10**11), 508_141_372, max_bytes=180_116_828_061, record_bytes=sizes)
    used = sum(end[s] * sizes[s] for s in start)
    assert used <= 180_116_828_061 and 180_116_828_061 - used < sizes["dearer"] and sum(end.values()) <= 508_141_372


def test_the_end_keeps_the_order_of_the_start() -> None:
    end = cap_batch_end({"b": 0, "a": 0}, {"a": 10, "b": 10, "c": 3}, 4)
    assert list(end) == ["b", "a", "c"] and end == {"b": 2, "a": 2, "c": 3}


def test_successive_byte_capped_batches_reach_the_end_once() -> None:
    start, latest, sizes = {"a": 0, "b": 0}, {"a": 700, "b": 300}, {"a": 200.0, "b": 50.0}
    batches = []
    while start != latest:
        end = cap_batch_end(start, latest, max_bytes=40_000, record_bytes=sizes)
        batches.append({s: end[s] - start[s] for s in start})
        assert sum(n * sizes[s] for s, n in batches[-1].items()) <= 40_000
        start = end
    assert sum(b["a"] for b in batches) == 700 and sum(b["b"] for b in batches) == 300


@pytest.mark.parametrize("since, new, held", [
    (None, 10, False),   # the query's first trigger never waits
    (5.0, 10, True),     # too few, too soon
    (5.0, 250, False),   # enough
    (60.0, 10, False),   # the delay is up
    (59.9, 0, True),
])
def test_min_offsets_per_trigger_holds_a_batch_until_enough_or_the_delay(
    since: float | None, new: int, held: bool
) -> None:
    start = {"a": 100, "b": 0}
    latest = {"a": 100 + new // 2, "b": new - new // 2}
    assert new_records(start, latest) == new
    assert hold_batch(start, latest, 250, since, 60.0) is held


@pytest.mark.parametrize("raw, seconds", [("15m", 900.0), ("30s", 30.0), ("500ms", 0.5), ("1h", 3600.0),
                                          ("2 min", 120.0), ("1d", 86400.0), ("1500", 1.5), ("0.5s", 0.5)])
def test_durations_read_as_spark_writes_them(raw: str, seconds: float) -> None:
    assert duration_seconds("maxTriggerDelay", raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw, error", [("soon", "is not a duration"), ("5 weeks", "is not a duration"),
                                        ("0s", "must be a positive duration"), ("-1s", "is not a duration")])
def test_bad_durations_are_refused_by_name(raw: str, error: str) -> None:
    with pytest.raises(ConfigurationError, match=f"maxTriggerDelay={re.escape(repr(raw))} {error}"):
        duration_seconds("maxTriggerDelay", raw)


def test_the_reader_holds_small_batches_back_until_enough_or_the_delay(
    monkeypatch: pytest.MonkeyPatch, open_reader: Any
) -> None:
    clock = Clock(1000.0)
    monkeypatch.setattr(source.time, "monotonic", clock.monotonic)
    r = open_reader({"a": 100, "b": 0}, minOffsetsPerTrigger="250", maxTriggerDelay="60s")
    limit = SimpleNamespace(min_rows=250)
    assert r.latestOffset({"a": 0, "b": 0}, limit) == {"a": 100, "b": 0}  # the first trigger: what there is
    r.test_latest["latest"] = {"a": 150, "b": 50}
    clock.now += 5
    assert r.latestOffset({"a": 100, "b": 0}, limit) == {"a": 100, "b": 0}  # 100 new: held (no batch)
    assert r.reportLatestOffset() == {"a": 150, "b": 50}
    r.test_latest["latest"] = {"a": 250, "b": 100}
    clock.now += 5
    assert r.latestOffset({"a": 100, "b": 0}, limit) == {"a": 250, "b": 100}  # 250 new: a batch
    r.test_latest["latest"] = {"a": 260, "b": 100}
    clock.now += 59
    assert r.latestOffset({"a": 250, "b": 100}, limit) == {"a": 250, "b": 100}
    clock.now += 1
    assert r.latestOffset({"a": 250, "b": 100}, limit) == {"a": 260, "b": 100}  # the delay is up: 10 go
    assert r.latestOffset({"a": 0, "b": 0}, SimpleNamespace()) == {"a": 260, "b": 100}  # Trigger.Once: all
    r.prepareForTriggerAvailableNow()
    r.test_latest["latest"] = {"a": 270, "b": 100}
    assert r.latestOffset({"a": 260, "b": 100}, limit) == {"a": 260, "b": 100}  # nothing new before its end
    r.available_now = {"a": 270, "b": 100}
    assert r.latestOffset({"a": 260, "b": 100}, limit) == {"a": 270, "b": 100}  # AvailableNow: never held


def test_the_reader_caps_bytes_at_sizes_sampled_where_each_batch_starts(
    monkeypatch: pytest.MonkeyPatch, open_reader: Any
) -> None:
    sampled: list[dict[str, int]] = []

    def record_bytes(connection: Any, at: dict[str, int], available: dict[str, int]) -> dict[str, float]:
        sampled.append(dict(at))
        return {stream: {"a": 1000.0, "b": 100.0}[stream] for stream in at if stream != failing}

    failing = "none"

    monkeypatch.setattr(source, "record_bytes", record_bytes)
    r = open_reader({"a": 400, "b": 400}, maxBytesPerTrigger="110000", maxRecordsPerTrigger="1000")
    limit = SimpleNamespace(max_rows=1000)  # the one limit Spark hands back; the byte cap still applies
    assert r.latestOffset({"a": 0, "b": 0}, limit) == {"a": 70, "b": 400}
    assert r.latestOffset({"a": 0, "b": 0}, limit) == {"a": 70, "b": 400}  # the same start: no new sample
    assert r.latestOffset({"a": 70, "b": 400}, limit) == {"a": 180, "b": 400}  # b has nothing new: not sampled
    assert sampled == [{"a": 0, "b": 0}, {"a": 70}]
    failing = "a"  # a sample that fails or times out keeps the last size, and is tried again next time
    assert r.latestOffset({"a": 180, "b": 400}, limit) == {"a": 290, "b": 400}
    assert r.latestOffset({"a": 180, "b": 400}, limit) == {"a": 290, "b": 400}
    assert sampled[-2:] == [{"a": 180}, {"a": 180}]


@pytest.mark.skipif(not admission_control_supported(), reason="this PySpark has no admission control")
def test_the_default_read_limit_names_one_kind_and_the_options_are_checked(open_reader: Any) -> None:
    from pyspark.sql.streaming.datasource import (  # type: ignore[import-not-found,unused-ignore]
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,
    )

    assert open_reader({}, maxBytesPerTrigger="5000").getDefaultReadLimit() == ReadMaxBytes(5000)
    assert open_reader({}, minOffsetsPerTrigger="50").getDefaultReadLimit() == ReadMinRows(50)
    assert open_reader({}, minOffsetsPerTrigger="50", maxRecordsPerTrigger="9",
                  maxBytesPerTrigger="5000").getDefaultReadLimit() == ReadMaxRows(9)
    with pytest.raises(ConfigurationError, match="maxBytesPerTrigger=0 must be positive"):
        open_reader({}, maxBytesPerTrigger="0")
    with pytest.raises(ConfigurationError, match="maxTriggerDelay='later' is not a duration"):
        open_reader({}, minOffsetsPerTrigger="5", maxTriggerDelay="later")


@pytest.mark.parametrize("option", ["maxBytesPerTrigger", "minOffsetsPerTrigger"])
def test_byte_and_min_limits_are_refused_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, open_reader: Any, option: str
) -> None:
    import pyspark

    monkeypatch.setattr(source, "admission_control_supported", lambda: False)
    with pytest.raises(ConfigurationError, match=rf"{option} needs admission control .* PySpark {pyspark.__version__}"):
        open_reader({}, **{option: "300"})


def test_the_sampler_weighs_what_it_reads_and_leaves_out_what_fails_or_is_late(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from smartclient.core.delivery import Chunk

    class Consumer:
        async def close(self) -> None:
            closed.append(1)

    class Env:
        async def consumer(self, stream: str, *, on_chunk: Any, options: Any) -> Consumer:
            if stream == "broken":
                raise ConnectionError("no route")
            if stream == "sized":  # two chunks: 40 records of 10 bytes, then 40 of 30
                on_chunk(Chunk(stream, list(range(40)), 0, [b"x" * 10] * 40, bytes))
                on_chunk(Chunk(stream, list(range(40, 80)), 0, [b"x" * 30] * 40, bytes))
            return Consumer()  # "late": no chunk ever comes

    closed: list[int] = []
    monkeypatch.setattr(source, "run_with_environment", lambda connection, work: asyncio.run(work(Env())))
    sizes = source.record_bytes(None, {"sized": 0, "broken": 0, "late": 0}, {"sized": 80, "late": 5}, wait=0.2)
    assert sizes == {"sized": (40 * 10 + 24 * 30) / 64}  # the first 64 records
    assert len(closed) == 2  # the late stream's consumer too
