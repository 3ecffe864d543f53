"""Consumer lag's pure rule (smartclient.core.lag): a stream's end from StreamStats on 4.3 and before, a
consumer's lag against it, the worst lag per name; and the gauge's readings, several Environments at once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from smartclient.core.lag import StreamEnd, consumer_lag, has_settled, worst
from smartclient.stream.lag import LAG_SAMPLE, LagSampler
from tests.unit.fakes import FakeConsumer

# -- the end of a stream ----------------------------------------------------------------------------------


def test_on_4_3_the_end_is_the_committed_offset_plus_one_and_an_empty_stream_ends_at_0() -> None:
    assert StreamEnd.from_stats({"first_chunk_id": 0, "committed_chunk_id": 900, "committed_offset": 999}) == \
        StreamEnd(1000, 0, exact=True)
    assert StreamEnd.from_stats({"first_chunk_id": -1, "committed_chunk_id": -1, "committed_offset": -1}) == \
        StreamEnd(0, 0, exact=True)


def test_on_4_3_positions_reached_do_not_move_the_end_the_broker_told() -> None:
    assert StreamEnd.from_stats({"committed_offset": 99}, [500]).next_offset == 100


def test_before_4_3_the_end_is_a_lower_bound_the_last_chunk_start_or_the_furthest_position_reached() -> None:
    stats = {"first_chunk_id": 0, "committed_chunk_id": 900, "last_chunk_id": 900}
    assert StreamEnd.from_stats(stats) == StreamEnd(900, 0, exact=False)
    assert StreamEnd.from_stats(stats, [None, 400, 1000]) == StreamEnd(1000, 0, exact=False)
    assert StreamEnd.from_stats({"committed_chunk_id": -1}) == StreamEnd(0, 0, exact=False)


def test_the_first_offset_is_where_retention_left_the_stream() -> None:
    assert StreamEnd.from_stats({"first_chunk_id": 5000, "committed_offset": 9999}).first_offset == 5000


# -- a consumer's lag -------------------------------------------------------------------------------------


def test_a_caught_up_consumer_reads_0_and_one_behind_reads_what_it_has_not_handed_over() -> None:
    end = StreamEnd(1000)
    assert consumer_lag(end, 1000) == 0  # handed over 0..999: waits for 1000, the next message's offset
    assert consumer_lag(end, 0) == 1000  # nothing handed over, from the first
    assert consumer_lag(end, 750) == 250


def test_a_position_past_the_sampled_end_reads_0_and_an_unknown_one_none() -> None:
    assert consumer_lag(StreamEnd(1000), 1200) == 0
    assert consumer_lag(StreamEnd(1000), None) is None


def test_a_consumer_before_what_retention_kept_counts_only_what_is_still_there() -> None:
    assert consumer_lag(StreamEnd(10_000, first_offset=8_000), 0) == 2_000


def test_a_settled_consumer_reads_0_though_offset_stores_or_filtered_chunks_lie_after_its_last_message() -> None:
    # two offset stores after message 9: the end is 12, the consumer waits for 10, and nothing will come
    end = StreamEnd(12)
    assert consumer_lag(end, 10) == 2
    assert has_settled((12, 10), (12, 10), idle=True) and consumer_lag(end, 10, settled=True) == 0


def test_a_consumer_held_in_its_callback_or_that_moved_or_whose_stream_grew_has_not_settled() -> None:
    assert not has_settled((12, 10), (12, 10), idle=False)  # a chunk waits for, or is in, its callback
    assert not has_settled((12, 8), (12, 10), idle=True)  # it moved
    assert not has_settled((11, 10), (12, 10), idle=True)  # the stream grew: the broker may be sending it
    assert not has_settled(None, (12, 10), idle=True)  # the first sample
    assert not has_settled((12, None), (12, None), idle=True) and consumer_lag(StreamEnd(12), None, True) is None


def test_the_worst_lag_per_stream_and_name_unknown_ones_left_out() -> None:
    got = worst([(("s", None), 5), (("s", None), 40), (("s", "billing"), 0), (("s", "billing"), None),
                 (("t", "audit"), None)])
    assert got == {("s", None): 40, ("s", "billing"): 0}


# -- the sampler, with a fake Environment -----------------------------------------------------------------


class SamplerHost(SimpleNamespace):  # (a sampler holds its Environment's carriers weakly)
    pass


def fake_host(consumers: list[Any], stats: dict[str, dict[str, int]], asked: list[str]) -> Any:
    async def topology(stream: str) -> Any:
        asked.append(stream)
        return SimpleNamespace(candidates=lambda role: stream)

    return SamplerHost(handles=consumers, topology=topology, recovery=SimpleNamespace(attempt_time=1.0),
                       placement=SimpleNamespace(connector=stats), connection_name="t")


async def test_a_sample_reads_each_stream_once_for_all_its_consumers(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {"s": {"committed_offset": 999}, "t": {"committed_chunk_id": 40}}

    async def stream_stats_from(connector: Any, candidates: Any, stream: str, name: str) -> dict[str, int]:
        return dict(connector[stream])

    monkeypatch.setattr("smartclient.stream.stats.stream_stats_from", stream_stats_from)
    a, b, c = FakeConsumer(1000, name="billing"), FakeConsumer(200, name=None), FakeConsumer(600, name=None)
    inactive, t = FakeConsumer(0, name="billing", active=False), FakeConsumer(10, stream="t", name="audit")
    held = FakeConsumer(0, stream="t", name="held", handing_over=True)
    asked: list[str] = []
    host = fake_host([a, b, c, inactive, t, held], stats, asked)
    sampler = LagSampler(host)
    await sampler.sample(host.handles)
    assert sorted(asked) == ["s", "t"]
    assert [sampler.lags[id(x)] for x in (a, b, c, inactive, t, held)] == [0, 800, 400, None, 30, 40]
    assert sampler.by_name == {("s", "billing"): 0, ("s", None): 800, ("t", "audit"): 30, ("t", "held"): 40}
    assert not sampler.ends["t"].exact
    # a period later nothing moved: the idle ones settled (what lies after them is no message), the held one not
    await sampler.sample(host.handles)
    assert [sampler.lags[id(x)] for x in (a, b, c, inactive, t, held)] == [0, 0, 0, None, 0, 40]


async def test_the_sampler_starts_on_the_first_read_and_stops_with_the_last_consumer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def stream_stats_from(connector: Any, candidates: Any, stream: str, name: str) -> dict[str, int]:
        return {"committed_offset": 9}

    monkeypatch.setattr("smartclient.stream.stats.stream_stats_from", stream_stats_from)
    consumer = FakeConsumer(4, name=None)
    host = fake_host([consumer], {}, [])
    sampler = LagSampler(host)
    assert sampler.lag(consumer) is None and sampler.task is None  # no loop attached yet: nothing to run on
    sampler.attach(asyncio.get_running_loop())
    assert sampler.lag(consumer) is None and sampler.task is not None  # started, no sample yet
    for _ in range(100):
        if sampler.samples:
            break
        await asyncio.sleep(0)
    assert sampler.lag(consumer) == 6  # ends at 10, waits for 4
    task = sampler.task
    consumer.closed = True
    sampler.forget(consumer)
    assert sampler.task is None and sampler.lags == {}
    with pytest.raises(asyncio.CancelledError):
        await task  # type: ignore[misc]
    assert LAG_SAMPLE.delay(1) == 5.0


async def test_a_read_from_another_thread_starts_the_sampler_on_the_environment_s_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync face reads ``consumer.lag`` on the caller's thread, and the gauge on the metric reader's."""
    async def stream_stats_from(connector: Any, candidates: Any, stream: str, name: str) -> dict[str, int]:
        return {"committed_offset": 9}

    monkeypatch.setattr("smartclient.stream.stats.stream_stats_from", stream_stats_from)
    consumer = FakeConsumer(10, name="x")
    host = fake_host([consumer], {}, [])
    sampler = LagSampler(host)
    sampler.attach(asyncio.get_running_loop())
    await asyncio.to_thread(sampler.worst)  # (the loop may take the first sample before the thread returns)
    for _ in range(100):
        if sampler.samples:
            break
        await asyncio.sleep(0)
    assert await asyncio.to_thread(sampler.worst) == {("s", "x"): 0} and sampler.task is not None
    consumer.closed = True
    sampler.forget(consumer)


# -- smartclient top ---------------------------------------------------------------------------------------

SCOPE = 'messaging_system="rabbitmq",otel_scope_name="smartclient",otel_scope_version=""'


def test_top_shows_each_consumer_s_lag_by_stream_and_name_and_says_when_none_was_sampled() -> None:
    from smartclient.top import ConsumerRow, Snapshot, parse, render, view

    text = (f'smartclient_consumer_lag{{messaging_destination_name="orders",{SCOPE},'
            f'messaging_consumer_group_name="billing"}} 12500.0\n'
            f'smartclient_consumer_lag{{messaging_destination_name="orders",{SCOPE}}} 0.0\n')
    frame = view(None, Snapshot(1.0, parse(text)))
    assert frame.consumers == [ConsumerRow("orders", "", 0), ConsumerRow("orders", "billing", 12500)]
    drawn = render(frame)
    [billing] = [line for line in drawn.splitlines() if "billing" in line]
    assert billing.split() == ["orders", "billing", "12,500"]
    [unnamed] = [line for line in drawn.splitlines() if "orders" in line and "billing" not in line]
    assert unnamed.split() == ["orders", "-", "0"]
    assert "CONSUMERS" in drawn and "(none sampled)" in render(view(None, Snapshot(1.0, {})))
