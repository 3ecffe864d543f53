"""The soak's pure parts: its plan, and the judgement of its resource samples. No broker."""

from __future__ import annotations

import time
from typing import Any

import pytest

from smartclient import ConfigurationError, ConnectionFailed
from smartclient.testing.checker import check
from smartclient.testing.nemesis import History
from smartclient.testing.soak import SoakPlan, check_resources, churn_handles, rollouts


def _sample(t: float, rolling: bool = False, **values: int) -> dict[str, Any]:
    return {"kind": "resources", "t": t, "rolling": rolling, "values": values}


def test_rolling_restarts_every_ten_minutes_each_ending_before_the_workload() -> None:
    assert SoakPlan(minutes=45).rollout_times == [300, 900, 1500, 2100]
    assert SoakPlan(minutes=3, first_rollout=40).rollout_times == [40]
    assert SoakPlan(minutes=1).rollout_times == []


@pytest.mark.parametrize(("field", "value", "match"), [
    ("minutes", 0, "minutes must be a positive"), ("churn_every", -1, "churn_every"),
    ("first_rollout", -5, "0 or more"),
    ("stream_every", 0, "1 or more cycles"), ("rss_growth", 2.0, "share between 0 and 1"),
    ("faults", ("kill", "flood"), "flood"), ("rate", True, "rate must be a positive"),
    ("trim_every", 0, "trim_every must be a positive"), ("trim_every", True, "trim_every must be a positive"),
    ("trim_every", float("inf"), "trim_every must be a positive"),
])
def test_a_bad_plan_is_refused_naming_the_field(field: str, value: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SoakPlan(**{field: value})


def test_counts_back_to_their_baseline_after_each_rollout_are_flat() -> None:
    records = [_sample(10, connections=9, **{"rss kib": 1000}),  # warm-up: not the baseline
               _sample(60, connections=6, **{"rss kib": 1000}),
               {"kind": "rollout", "t": 120, "began": 80},
               _sample(90, True, connections=9, **{"rss kib": 1040}),
               _sample(150, connections=7, **{"rss kib": 1030}), _sample(160, connections=6, **{"rss kib": 1020})]
    report = check_resources(records, warmup=60, settle=20)
    assert report.baseline == {"connections": 6, "rss kib": 1000} and report.peak["connections"] == 9
    assert not report.not_back and not report.unjudged
    # RSS is judged from the first settled sample after the first rollout (every path has run once by then)
    assert report.rss_baseline == 1030 and report.rss_growth == pytest.approx(1020 / 1030 - 1) and report.flat(0.05)
    assert report.rss_growth_since_warmup == pytest.approx(0.02)
    assert report.rss_lows == [1020]  # shown: the lowest in each rollout's settled window (RSS swings with the GC)


def test_a_count_that_never_comes_back_or_rss_that_grows_is_named() -> None:
    records = [_sample(60, tasks=10, **{"rss kib": 1000}), {"kind": "rollout", "t": 100, "began": 70},
               _sample(130, tasks=12, **{"rss kib": 1100}), _sample(140, tasks=11, **{"rss kib": 1160})]
    report = check_resources(records, warmup=60, settle=20)
    assert report.not_back == {"tasks": ["the rollout at 70 s", "the end"]}
    assert report.rss_growth == pytest.approx(1160 / 1100 - 1) and not report.flat(0.05)
    assert report.rss_growth_since_warmup == pytest.approx(0.16)
    assert "NOT BACK after the rollout at 70 s" in report.table()


def test_the_metadata_cache_is_judged_from_its_level_not_from_a_baseline_a_fault_emptied() -> None:
    """CI, seed 18: a fault just before the baseline left 6 of 11 entries; use filled them again."""
    entries = "metadata cache entries"
    records = [_sample(5, **{entries: 11}), _sample(60, **{entries: 6}), {"kind": "rollout", "t": 100, "began": 70},
               _sample(130, **{entries: 11}), _sample(140, **{entries: 11})]
    assert not check_resources(records, warmup=60, settle=20, nodes=3).not_back
    grown = [*records[:3], _sample(130, **{entries: 15}), _sample(140, **{entries: 15})]
    assert check_resources(grown, warmup=60, settle=20, nodes=3).not_back == {entries: ["the rollout at 70 s",
                                                                                         "the end"]}


def test_a_rollout_with_no_settled_sample_after_it_is_said_unjudged() -> None:
    records = [_sample(60, tasks=10), {"kind": "rollout", "t": 100, "began": 70}, _sample(110, tasks=10)]
    report = check_resources(records, warmup=60, settle=20)
    assert report.unjudged == ["the rollout at 70 s", "the end"]


def test_each_rollout_reports_the_progress_after_its_node_stops() -> None:
    history = [{"kind": "send", "t": 1.0, "client": "p", "id": 1}, {"kind": "send", "t": 1.0, "client": "p", "id": 2},
               {"kind": "rollout_began", "t": 10.0, "index": 0},
               {"kind": "fault", "t": 10.0, "what": "roll", "target": "rabbit-1"},
               {"kind": "confirm", "t": 11.0, "client": "p", "id": 1},
               {"kind": "fault", "t": 20.0, "what": "roll", "target": "rabbit-2"},
               {"kind": "confirm", "t": 22.0, "client": "p", "id": 2},
               {"kind": "rollout", "t": 30.0, "index": 0, "began": 10.0}]
    [rollout] = rollouts(history, check(history))
    assert rollout.progress == pytest.approx([1.0, 2.0]) and rollout.p99(rollout.progress) == pytest.approx(2.0)
    assert rollout.rolled == 2 and rollout.errors == []


def test_a_node_the_rollout_could_not_roll_is_reported_not_counted_as_rolled() -> None:
    """The broker's pre-stop check failed (the 45-minute run of 2026-11-26: every roll): the node was never
    stopped, so the rollout proves nothing about it, and the soak says so."""
    history = [{"kind": "rollout_began", "t": 10.0, "index": 0},
               {"kind": "fault_error", "t": 130.0, "what": "roll", "error": "TestBedError: await_online timed out"},
               {"kind": "heal", "t": 130.0, "what": "roll", "target": "rabbit-1", "down": -1.0},
               {"kind": "fault", "t": 131.0, "what": "roll", "target": "rabbit-2"},
               {"kind": "rollout", "t": 150.0, "index": 0, "began": 10.0}]
    [rollout] = rollouts(history, check(history))
    assert rollout.rolled == 1 and rollout.errors == ["TestBedError: await_online timed out"]


def test_a_count_whose_low_rises_from_each_rollout_to_the_next_is_growing_even_under_its_slack() -> None:
    records = [_sample(60, connections=6)]
    for k, began in enumerate((100, 300, 500)):  # one connection more after each rollout: within the slack of 6
        records += [{"kind": "rollout", "t": began + 40, "began": began},
                    _sample(began + 70, connections=7 + k), _sample(began + 80, connections=7 + k)]
    report = check_resources(records, warmup=60, settle=20)
    assert report.not_back == {"connections": ["growing"]} and not report.flat(0.05)


def test_a_count_missing_at_the_baseline_is_judged_from_zero() -> None:
    records = [_sample(60, tasks=1), {"kind": "rollout", "t": 100, "began": 70}, _sample(130, tasks=1, leaked=2)]
    assert check_resources(records, warmup=60, settle=20).not_back == {"leaked": ["the rollout at 70 s", "the end"]}


def test_a_socket_whose_peer_closed_and_nobody_closed_is_counted_half_closed() -> None:
    import socket

    from smartclient.testing.footprint import half_closed_sockets

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = server.accept()
            assert half_closed_sockets({port}) == 0
            accepted.close()  # the peer closes; the client does not
            deadline = time.monotonic() + 5
            while half_closed_sockets({port}) != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert half_closed_sockets({port}) == 1 and half_closed_sockets({port + 1}) == 0
        assert half_closed_sockets({port}) == 0  # closed: gone


def test_the_delivery_watchs_resubscriptions_are_counted_by_kind_and_its_quiet_ones_stay_quiet() -> None:
    import logging

    from smartclient.stream import unreported
    from smartclient.testing.soak import _WatchCount

    watcher = logging.getLogger(unreported.__name__)
    count = _WatchCount(logging.WARNING)  # the logger's level before the soak: INFO lines were not shown
    shown: list[str] = []

    class Shown(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            shown.append(record.getMessage())

    handler, level = Shown(), watcher.level
    watcher.addFilter(count)
    watcher.addHandler(handler)
    watcher.setLevel(logging.INFO)
    try:
        watcher.warning("silent", extra={unreported.WATCH_RECORD: "rescue"})
        watcher.info("a tracking chunk", extra={unreported.WATCH_RECORD: "last chunk"})
        watcher.info("something else")
    finally:
        watcher.removeFilter(count)
        watcher.removeHandler(handler)
        watcher.setLevel(level)
    assert dict(count.kinds) == {"rescue": 1, "last chunk": 1}
    assert shown == ["silent"]


def test_each_resubscription_s_facts_are_handed_on_and_told_apart_as_a_silence_or_a_tracking_chunk() -> None:
    import logging

    from smartclient.stream import unreported
    from smartclient.testing.soak import _WatchCount, watch_evidence

    fired: list[tuple[str, dict[str, object]]] = []
    watcher = logging.getLogger(unreported.__name__)
    count = _WatchCount(logging.WARNING, on_fire=lambda kind, facts: fired.append((kind, facts)))
    watcher.addFilter(count)
    level = watcher.level
    watcher.setLevel(logging.INFO)
    try:
        facts = {"stream": "s", "node": "n1", "waiting_for": 7, "committed": 7, "silent": 5.0}
        watcher.info("a last chunk", extra={unreported.WATCH_RECORD: "last chunk", unreported.WATCH_FACTS: facts})
        watcher.info("something else")
    finally:
        watcher.removeFilter(count)
        watcher.setLevel(level)
    assert fired == [("last chunk", facts)]
    records = [{"kind": "stored", "t": 1.0, "stream": "s", "offset": 5}, {"kind": "marker", "t": 2.0, "stream": "s",
                                                                          "offset": 9},
               {"kind": "watch", "t": 1.5, "watch": "last chunk", **facts, "broker": [{"credits": 9}]},
               {"kind": "watch", "t": 1.6, "watch": "rescue", **facts, "committed": 9, "broker": []},
               {"kind": "watch", "t": 1.7, "watch": "last chunk", **facts, "stream": "tmp-1", "broker": []}]
    tracking, silence, unknown = watch_evidence(records)
    assert "waiting for offset 7, committed chunk 7" in tracking and "offset-tracking chunks" in tracking
    assert "'credits': 9" in tracking
    # a tracking chunk at 7, the end marker at 9: silent on a data message all the same
    assert "committed chunk 9" in silence and "a data message there (a silence)" in silence
    assert "tmp-1" in unknown and "not known (the stream was not read back)" in unknown
    assert watch_evidence(records, shown=1)[-1] == "  and 2 more (the history's watch records)"


def test_a_watch_record_that_cannot_be_written_does_not_stop_the_watch() -> None:
    import logging

    from smartclient.stream import unreported
    from smartclient.testing.soak import _WatchCount

    def broken(kind: str, facts: dict[str, object]) -> None:
        raise OSError("the history file is closed")

    count = _WatchCount(logging.WARNING, on_fire=broken)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "silent", None, None)
    setattr(record, unreported.WATCH_RECORD, "rescue")
    assert count.filter(record) is True  # no exception: the watch goes on to subscribe again
    assert dict(count.kinds) == {"rescue": 1, "not recorded": 1}


class _CountedHandle:
    def __init__(self, opened: list[str], kind: str) -> None:
        self.opened, self.kind = opened, kind
        opened.append(kind)

    async def close(self) -> None:
        self.opened.remove(self.kind)


class _FailingProducerEnv:
    """An Environment whose consumers open and whose producers fail to (as during a rollout)."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    async def consumer(self, stream: str, callback: Any, offset: str) -> _CountedHandle:
        return _CountedHandle(self.opened, "consumer")

    async def producer(self, stream: str, name: str) -> _CountedHandle:
        raise ConnectionFailed(f"no connection to the leader of {stream!r}")


async def test_a_churn_cycle_whose_producer_cannot_open_closes_the_consumer_it_opened() -> None:
    # the 2-hour soak of 2026-11-27: 4 producer opens failed during rollouts, and each left its consumer open
    env = _FailingProducerEnv()
    with pytest.raises(ConnectionFailed, match="leader"):
        await churn_handles(env, "s", "p", range(1, 11), History())
    assert env.opened == []
