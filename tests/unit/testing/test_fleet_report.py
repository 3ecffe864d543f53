"""``smartclient.testing.fleet``'s report: percentiles and per-handle figures."""

from __future__ import annotations

import math

import pytest

from smartclient.testing.fleet import FleetRound, percentile


def test_percentiles_are_nearest_rank_and_empty_is_nan() -> None:
    values = tuple(float(i) for i in range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile((3.0,), 99) == 3.0 and math.isnan(percentile((), 50))


def test_a_rounds_line_says_what_came_back_and_what_it_cost() -> None:
    r = FleetRound(processes=2, jitter=0.5, handles=40, back=(0.5, 1.0, 4.0), failed=1, dials=3, placements=6,
                   metadata_peak=12, own=(0.5, 0.6, 1.0), election=3.0)
    assert (r.p50, r.p99, r.worst, r.per_handle(r.dials), r.own_p99) == (1.0, 4.0, 4.0, 1.0, 1.0)
    assert r.line() == ("  2 process(es), jitter 0.5: 3 handles back of 40 (1 not): p50 1.00 s, p99 4.00 s, "
                        "worst 4.00 s after the kill; 1.00 dials and 2.00 placements per handle back; Metadata "
                        "requests in the peak second 12; the slowest election 3.00 s, own p99 1.00 s")
    assert math.isnan(FleetRound(1, 0.0, 2, (), 2, 0, 0, 0).worst)


def test_rounds_pool_their_handles_back_and_sum_their_counts() -> None:
    from smartclient.testing.fleet import pooled

    a = FleetRound(1, 0.0, 20, (0.5, 4.0), 0, 2, 2, 8, own=(0.5, 0.6), election=3.4)
    b = FleetRound(1, 0.0, 20, (0.3, 0.4, 0.6), 1, 3, 3, 14, own=(0.3, 0.4, 0.6))
    both = pooled([a, b])
    assert both.back == (0.3, 0.4, 0.5, 0.6, 4.0) and (both.handles, both.failed, both.dials) == (40, 1, 5)
    assert both.metadata_peak == 14 and both.p50 == 0.5
    assert both.own == (0.3, 0.4, 0.5, 0.6, 0.6) and both.election == 3.4  # (the slowest of the rounds)


def test_the_dials_by_purpose_are_summed_and_said() -> None:
    from smartclient.testing.fleet import pooled

    a = FleetRound(1, 0.0, 20, (0.5,), 0, 5, 2, 8, dials_by=(("placement", 3), ("ready", 2)))
    b = FleetRound(1, 0.0, 20, (0.4,), 0, 4, 2, 8, dials_by=(("ready", 4),))
    both = pooled([a, b])
    assert both.dials_by == (("ready", 6), ("placement", 3))
    assert both.line().endswith("; dials for ready 6, placement 3")


def test_the_cpu_of_the_second_after_the_kill_is_averaged_over_rounds_and_said() -> None:
    from smartclient.testing.fleet import pooled

    a = FleetRound(1, 0.0, 20, (0.5,), 0, 1, 1, 8, cpu=(("all", 1.4), ("fleet", 0.7), ("beam", 0.5)))
    b = FleetRound(1, 0.0, 20, (0.4,), 0, 1, 1, 8, cpu=(("all", 1.0), ("fleet", 0.5), ("beam", 0.3)))
    unmeasured = FleetRound(1, 0.0, 20, (0.4,), 0, 1, 1, 8)  # (no /proc: not counted as zero)
    both = pooled([a, b, unmeasured])
    assert [who for who, _ in both.cpu] == ["all", "fleet", "beam"]
    assert dict(both.cpu) == pytest.approx({"all": 1.2, "fleet": 0.6, "beam": 0.4})
    assert a.line().endswith("; CPU-s in the second after the kill: all 1.40, fleet 0.70, beam 0.50")
    assert pooled([unmeasured]).cpu == ()
