"""``smartclient top``'s pure parts: the Prometheus text parser, rates and events between two polls, the frame."""

from __future__ import annotations

import pytest

from smartclient import ConfigurationError, ConnectionFailed
from smartclient.top import Snapshot, fetch, parse, render, view

SCOPE = 'messaging_system="rabbitmq",otel_scope_name="smartclient",otel_scope_version=""'


def exposition(published: float, confirmed: float, mismatches: float, recoveries: float) -> str:
    on = f'messaging_destination_name="orders",{SCOPE}'
    return f"""# HELP rabbitmq_stream_published_total messages handed to the broker
# TYPE rabbitmq_stream_published_total counter
rabbitmq_stream_published_total{{{on}}} {published}
rabbitmq_stream_confirmed_total{{{on}}} {confirmed}
rabbitmq_stream_consumed_total{{{on}}} {confirmed}
rabbitmq_stream_errored_total{{{on}}} 0.0
rabbitmq_stream_outstanding_publish_confirm{{{on}}} {published - confirmed}
rabbitmq_stream_connections{{{SCOPE}}} 2.0
smartclient_connections{{{SCOPE},server_node="rabbit-1:5552",smartclient_role="producer"}} 1.0
smartclient_connections{{{SCOPE},server_node="rabbit-2:5552",smartclient_role="consumer"}} 1.0
smartclient_clients{{{SCOPE},network_protocol_name="mqtt",server_node="rabbit@n3"}} 5.0
smartclient_placement_sessions_total{{{SCOPE}}} 4.0
smartclient_placement_reused_total{{{SCOPE}}} 1.0
smartclient_placement_mismatches_total{{{SCOPE},smartclient_reason="another node"}} {mismatches}
smartclient_recoveries_total{{{on}}} {recoveries}
smartclient_recovery_duration_seconds_count{{{on},smartclient_outcome="recovered"}} {recoveries}
smartclient_recovery_duration_seconds_sum{{{on},smartclient_outcome="recovered"}} {recoveries * 0.5}
smartclient_recovery_duration_seconds_bucket{{{on},le="+Inf"}} {recoveries}
python_gc_objects_collected_total{{generation="0"}} 123.0
target_info{{service_name="svc"}} 1.0
"""


def test_the_parser_keeps_smartclient_series_and_unescapes_label_values() -> None:
    text = 'smartclient_connections{server_node="a\\\\b \\"q\\"\\nx",otel_scope_name="s"} 3 1700000000\n# a comment\n'
    assert parse(text) == {("smartclient_connections", (("server_node", 'a\\b "q"\nx'),)): 3.0}
    assert parse("python_info 1\nnot a sample line\nsmartclient_x NaNish\n") == {}


def test_rates_mismatches_and_recoveries_come_from_two_polls() -> None:
    first = Snapshot(10.0, parse(exposition(1000, 900, 1, 0)))
    second = Snapshot(12.0, parse(exposition(3000, 2900, 3, 1)))
    frame = view(first, second)
    [row] = frame.streams
    assert (row.stream, row.published, row.publish_rate, row.confirm_rate, row.outstanding) == (
        "orders", 3000, 1000.0, 1000.0, 100)
    assert frame.connections == {("rabbit-1:5552", "producer"): 1, ("rabbit-2:5552", "consumer"): 1}
    assert frame.clients == {("mqtt", "rabbit@n3"): 5}
    assert (frame.sessions, frame.reused, frame.mismatches) == (4, 1, {"another node": 3})
    assert frame.recoveries == 1 and frame.recovery_mean == 0.5
    assert frame.events == ["2 node mismatch(es): another node", "1 recovery(ies) on orders"]
    text = render(frame, frame.events, "http://svc:9464/metrics")
    assert "rabbit-1:5552" in text and "1,000/s" in text and "another node 3" in text and "mean 0.50 s" in text


def test_the_first_poll_has_no_rates_and_an_empty_endpoint_draws_empty_sections() -> None:
    frame = view(None, Snapshot(1.0, parse(exposition(10, 10, 0, 0))))
    assert frame.streams[0].publish_rate is None and frame.events == []
    assert "-" in render(frame)
    empty = render(view(None, Snapshot(1.0, {})))
    assert "(none)" in empty and "(nothing yet)" in empty


def test_a_bad_url_and_an_unreachable_endpoint_are_typed_errors() -> None:
    with pytest.raises(ConfigurationError, match="http"):
        fetch("svc:9464/metrics")
    with pytest.raises(ConnectionFailed, match="could not read"):
        fetch("http://127.0.0.1:9/metrics", timeout=1)


def test_a_super_streams_partitions_show_their_lag_and_the_one_falling_behind_is_marked() -> None:
    lines = [f"rabbitmq_stream_connections{{{SCOPE},server_node=\"rabbit-{n}:5552\"}} {n}.0" for n in (1, 2)]
    for p in range(12):
        lag = 40_000 if p == 7 else 1_000 + p
        for name in ("billing", "audit"):  # two groups: a partition's lag is the larger
            on = f'messaging_destination_name="orders-{p}",messaging_consumer_group_name="{name}"'
            lines.append(f'smartclient_consumer_lag{{{SCOPE},{on},smartclient_super_stream="orders"}} '
                         f'{lag if name == "billing" else 5}')
    lines.append(f'smartclient_consumer_lag{{{SCOPE},messaging_destination_name="plain"}} 3')
    frame = view(None, Snapshot(1.0, parse("\n".join(lines))))
    [row] = frame.super_streams
    assert row.super_stream == "orders" and len(row.lags) == 12 and row.lags[0] == ("orders-7", 40_000)
    assert row.median == 1_005.5 and row.behind() == [("orders-7", 40_000)]
    assert [c.stream for c in frame.consumers] == ["plain"]  # partitions are shown with their super stream
    assert frame.stream_connections == 3 and frame.stream_connections_by_node == {"rabbit-1:5552": 1,
                                                                                    "rabbit-2:5552": 2}
    text = render(frame)
    assert "(rabbit-1:5552 1, rabbit-2:5552 2)" in text
    assert "SUPER STREAM  orders: 12 partitions, lag median 1,006, highest 40,000; 1 behind" in text
    assert "orders-7" in text and "40,000  BEHIND" in text and "... 4 more" in text


def test_a_super_stream_whose_partitions_are_all_near_zero_has_none_behind() -> None:
    from smartclient.top import SuperStreamRow

    assert SuperStreamRow("s", [("s-1", 50.0), ("s-0", 0.0), ("s-2", 0.0)]).behind() == []  # (below the floor)
