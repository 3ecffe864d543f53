"""The nemesis checker on hand-made histories: each kind of anomaly must be caught. No broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from smartclient import ConfigurationError
from smartclient.testing.checker import check, read_history


def _producer_records(client: str, ids: range, stored: list[int], *, stream: str = "s", t0: float = 0.0,
              failed: dict[int, str] | None = None, code: int = 17) -> list[dict[str, Any]]:
    failed = failed or {}
    records: list[dict[str, Any]] = []
    for i in ids:
        records.append({"kind": "send", "t": t0 + i * 0.001, "client": client, "id": i})
        if i in failed:
            records.append({"kind": "fail", "t": t0 + i * 0.001 + 0.0005, "client": client, "id": i,
                            "reason": failed[i], "code": code})
        else:
            records.append({"kind": "confirm", "t": t0 + i * 0.001 + 0.0005, "client": client, "id": i})
    records += [{"kind": "stored", "t": 100.0, "client": client, "stream": stream, "offset": n, "id": i}
                for n, i in enumerate(stored)]
    return records


def _consumer(client: str, offsets: list[int], *, t0: float = 0.0) -> list[dict[str, Any]]:
    return [{"kind": "deliver", "t": t0 + n * 0.001, "client": client, "stream": "s", "offset": o}
            for n, o in enumerate(offsets)]


def test_a_clean_history_is_ok() -> None:
    report = check(_producer_records("p", range(10), list(range(10))) + _consumer("c", list(range(10))))
    assert report.ok and report.lost == 0 and report.duplicated == 0
    assert report.producers["p"].confirmed == 10 and report.consumers["c"].delivered == 10


def test_a_loss_is_caught() -> None:
    report = check(_producer_records("p", range(10), [0, 1, 2, 4, 5, 6, 7, 8, 9]))
    assert not report.ok and report.producers["p"].lost == [3]


def test_a_duplicate_is_caught() -> None:
    report = check(_producer_records("p", range(5), [0, 1, 2, 2, 3, 4]))
    assert not report.ok and report.producers["p"].duplicated == [2]


def test_a_reordering_is_caught_but_partitions_keep_their_own_order() -> None:
    report = check(_producer_records("p", range(5), [0, 1, 3, 2, 4]))
    assert not report.ok and report.producers["p"].out_of_order == [2]
    across = (_producer_records("q", range(4), [1, 3], stream="part-0")
              + _producer_records("q", range(0), [0, 2], stream="part-1"))
    assert check(across).producers["q"].out_of_order == []


def test_a_consumer_gap_and_its_duplicates() -> None:
    report = check(_consumer("c", [0, 1, 2, 2, 5, 6, 9]))
    assert not report.ok
    assert report.consumers["c"].gaps == [(3, 4), (7, 8)] and report.consumers["c"].duplicates == 1


def test_offsets_that_hold_no_message_are_no_gap_once_the_stream_is_read_back() -> None:
    # offset 3 is an offset-tracking record: stored messages are at 0-2 and 4-5, and the consumer got them all
    stored = [{"kind": "stored", "t": 9.0, "client": "p", "stream": "s", "offset": o, "id": i}
              for i, o in enumerate([0, 1, 2, 4, 5])]
    assert check(stored + _consumer("c", [0, 1, 2, 4, 5])).consumers["c"].gaps == []
    assert check(stored + _consumer("c", [0, 1, 5])).consumers["c"].gaps == [(2, 2), (4, 4)]


def test_failures_need_a_reason_and_a_failed_id_must_not_be_stored() -> None:
    report = check(_producer_records("p", range(3), [0, 1], failed={2: ""}))
    assert report.producers["p"].failed_without_reason == [2] and not report.ok
    report = check(_producer_records("p", range(3), [0, 1, 2], failed={2: "refused"}))
    assert report.producers["p"].unexplained == [2] and not report.ok
    assert check(_producer_records("p", range(3), [0, 1], failed={2: "refused"})).ok


def test_a_message_the_client_gave_up_on_may_be_stored_and_is_counted_apart() -> None:
    report = check(_producer_records("p", range(3), [0, 1, 2], failed={2: "not confirmed within 60 s"}, code=-2))
    assert report.ok and report.producers["p"].given_up_stored == 1 and "given up but stored 1" in report.summary()


def test_a_refused_send_was_never_sent_and_must_not_be_stored() -> None:
    records = _producer_records("p", range(2), [0, 1, 2])
    records.append({"kind": "refused", "t": 0.01, "client": "p", "id": 2, "reason": "EnqueueTimeout"})
    assert check(records).producers["p"].unexplained == [2]


def test_a_tracked_consumer_must_resume_after_its_stored_offset() -> None:
    history = [{"kind": "subscribe", "t": 0.0, "client": "c", "stream": "s", "stored_offset": None, "tracked": True},
               *_consumer("c", [0, 1, 2, 3]),
               {"kind": "subscribe", "t": 1.0, "client": "c", "stream": "s", "stored_offset": 3, "tracked": True},
               *_consumer("c", [3, 4], t0=1.1)]
    report = check(history)
    assert report.consumers["c"].resumed_before_stored == [3] and not report.ok


def test_progress_after_each_fault_worst_and_p99() -> None:
    history = [*_producer_records("p", range(3), [0, 1, 2]),
               {"kind": "fault", "t": 1.0, "what": "kill", "target": "rabbit-1"},
               {"kind": "confirm", "t": 1.5, "client": "p", "id": 3},
               {"kind": "fault", "t": 2.0, "what": "lb_cut", "target": "rabbit-2"},
               {"kind": "op", "t": 4.0, "client": "rpc", "ok": False, "error": "ConnectionFailed"},
               {"kind": "op", "t": 2.5, "client": "rpc", "ok": True},
               {"kind": "confirm", "t": 2.2, "client": "p", "id": 4}]
    report = check(history)
    assert report.faults == {"kill": 1, "lb_cut": 1}
    assert report.progress["p"] == pytest.approx([0.5, 0.2])
    assert report.worst_progress() == pytest.approx(0.5) and report.p99_progress() == pytest.approx(0.5)
    assert report.op_errors["rpc"] == {"ConnectionFailed": 1} and report.ops_ok["rpc"] == 1
    assert "lost 2" in report.summary()  # 3 and 4 were confirmed but never read back


def test_a_setup_step_is_counted_but_not_timed_against_later_faults() -> None:
    """Starting the RPC servers is a one-off: a fault after it must not wait on it forever."""
    history = [{"kind": "op", "t": 0.1, "client": "rpc-server", "ok": False, "error": "ConnectionFailed",
                "setup": True},
               {"kind": "op", "t": 0.2, "client": "rpc", "ok": True},
               {"kind": "fault", "t": 1.0, "what": "kill", "target": "rabbit-1"},
               {"kind": "op", "t": 1.3, "client": "rpc", "ok": True},
               {"kind": "op", "t": 40.0, "client": "rpc-server", "ok": True, "setup": True}]
    report = check(history)
    assert report.progress == {"rpc": pytest.approx([0.3])}
    assert report.op_errors["rpc-server"] == {"ConnectionFailed": 1} and report.ops_ok["rpc-server"] == 1


def test_progress_is_also_timed_from_when_the_broker_had_every_leader_again() -> None:
    """A kill after which the broker named s1's leader 4 s later and s2's at once: p (on s1) progressed 4.3 s
    after the fault, 0.3 s after the broker let it; q (on s2) 0.1 s after the fault, 0.05 s after its leader."""
    history = [{"kind": "send", "t": 9.0, "client": "p", "id": 1}, {"kind": "send", "t": 9.0, "client": "q", "id": 1},
               {"kind": "fault", "t": 10.0, "what": "kill", "target": "rabbit-1"},
               {"kind": "confirm", "t": 10.1, "client": "q", "id": 1},
               {"kind": "leaders", "t": 14.0, "fault_t": 10.0, "target": "rabbit-1", "missing": 0,
                "streams": {"s1": 14.0, "s2": 10.05}},
               {"kind": "confirm", "t": 14.3, "client": "p", "id": 1},
               {"kind": "stored", "t": 20.0, "stream": "s1", "offset": 0, "client": "p", "id": 1},
               {"kind": "stored", "t": 20.0, "stream": "s2", "offset": 0, "client": "q", "id": 1}]
    report = check(history)
    assert report.progress == {"p": pytest.approx([4.3]), "q": pytest.approx([0.1])}
    assert report.beyond_broker == {"p": pytest.approx([0.3]), "q": pytest.approx([0.05])}
    assert report.elections == pytest.approx([4.0]) and report.p99_beyond_broker() == pytest.approx(0.3)
    assert "named every leader again in 4.00 s" in report.summary()


def test_a_saved_history_is_read_back_and_a_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _producer_records("p", range(3), [0, 1, 2])) + "\n")
    assert check(read_history(path)).ok
    path.write_text('{"kind": "send", "t": 0, "client": "p", "id": 1}\nnot json\n')
    with pytest.raises(ConfigurationError, match=r"history.jsonl:2 is not JSON"):
        read_history(path)


def test_the_clients_own_share_starts_when_its_stream_took_a_write_again() -> None:
    """A kill after which s1 took the probe's write 4.5 s later: p (on s1) progressed 4.7 s after the fault, so
    0.2 s of the wait was its own; the probe's messages are stored and checked, never a client's progress."""
    history = [{"kind": "send", "t": 9.0, "client": "p", "id": 1},
               {"kind": "fault", "t": 10.0, "what": "kill", "target": "rabbit-1"},
               {"kind": "send", "t": 14.4, "client": "probe", "id": 1},
               {"kind": "confirm", "t": 14.5, "client": "probe", "id": 1},
               {"kind": "writable", "t": 14.6, "fault_t": 10.0, "target": "rabbit-1", "missing": 0,
                "streams": {"s1": 14.5}},
               {"kind": "confirm", "t": 14.7, "client": "p", "id": 1},
               {"kind": "stored", "t": 20.0, "stream": "s1", "offset": 0, "client": "p", "id": 1},
               {"kind": "stored", "t": 20.0, "stream": "s1", "offset": 1, "client": "probe", "id": 1}]
    report = check(history)
    assert report.ok and "probe" not in report.progress
    assert report.progress == {"p": pytest.approx([4.7])} and report.own == {"p": pytest.approx([0.2])}
    assert report.unwritable == pytest.approx([4.5]) and report.p99_own() == pytest.approx(0.2)
    assert report.delays == [("p", 10.0, 14.7, pytest.approx(0.2))]
    assert "took a write again in 4.50 s" in report.summary()


def test_after_a_silent_drop_the_own_share_starts_once_it_was_found_or_for_a_queue_client_healed() -> None:
    """A partition at 10 s: s1 took the probe's write at once (its leader elsewhere), but the consumer c sat on the
    cut node, and its producer p too: p found its connection dead at 20 s (its watch, against its bound), and c got
    the next message at 20.3 s: 0.3 s of c's wait was its own, not 10.3.  The queue client q (no probe follows it)
    progressed only at 31 s, 1 s after the heal."""
    history = [{"kind": "send", "t": 9.0, "client": "p", "id": 1},
               {"kind": "confirm", "t": 9.1, "client": "p", "id": 1},
               {"kind": "deliver", "t": 9.2, "client": "c", "stream": "s1", "offset": 0},
               {"kind": "op", "t": 9.3, "client": "q", "ok": True},
               {"kind": "fault", "t": 10.0, "what": "cut-lb", "target": "rabbit-1", "silent": True},
               {"kind": "writable", "t": 10.6, "fault_t": 10.0, "target": "rabbit-1", "missing": 0,
                "streams": {"s1": 10.5}},
               {"kind": "found", "t": 20.2, "client": "p", "wing": "stream", "started": 20.0},
               {"kind": "send", "t": 20.1, "client": "p", "id": 2},
               {"kind": "confirm", "t": 20.2, "client": "p", "id": 2},
               {"kind": "deliver", "t": 20.3, "client": "c", "stream": "s1", "offset": 1},
               {"kind": "heal", "t": 30.0, "what": "cut-lb", "target": "rabbit-1"},
               {"kind": "op", "t": 31.0, "client": "q", "ok": True},
               {"kind": "stored", "t": 40.0, "stream": "s1", "offset": 0, "client": "p", "id": 1},
               {"kind": "stored", "t": 40.0, "stream": "s1", "offset": 1, "client": "p", "id": 2}]
    report = check(history)
    assert report.ok
    assert report.own == {"p": pytest.approx([0.2]), "c": pytest.approx([0.3]), "q": pytest.approx([1.0])}


def test_after_a_silent_drop_a_queue_client_whose_queue_was_probed_is_timed_from_the_probe_not_the_heal() -> None:
    """A partition at 10 s, healed at 30 s: the queue qq (its client q uses it) took the probe's write at 24 s, q
    progressed at 24.4 s: 0.4 s of its own.  Its producer found nothing (no finding after the probe)."""
    history = [{"kind": "uses", "t": 0.0, "client": "q", "stream": "qq"},
               {"kind": "op", "t": 9.3, "client": "q", "ok": True},
               {"kind": "fault", "t": 10.0, "what": "cut-lb", "target": "rabbit-1", "silent": True},
               {"kind": "writable", "t": 24.1, "fault_t": 10.0, "target": "rabbit-1", "missing": 0,
                "streams": {"qq": 24.0}},
               {"kind": "op", "t": 24.4, "client": "q", "ok": True},
               {"kind": "heal", "t": 30.0, "what": "cut-lb", "target": "rabbit-1"}]
    report = check(history)
    assert report.ok and report.own == {"q": pytest.approx([0.4])}


def test_a_queue_client_is_timed_from_its_queues_first_write_after_the_drop_was_found() -> None:
    """A partition at 10 s: the queue qq took the probe's writes all along (10.5 s, then 18.2 s...), but its
    client q sat on the cut node and found it at 18 s; it progressed at 18.6 s: 0.4 s of its own (from the probe's
    first write once it had found the drop), not 8.1 s."""
    history = [{"kind": "uses", "t": 0.0, "client": "q", "stream": "qq"},
               {"kind": "op", "t": 9.3, "client": "q", "ok": True},
               {"kind": "fault", "t": 10.0, "what": "cut-lb", "target": "rabbit-1", "silent": True},
               {"kind": "queue_back", "t": 10.5, "queue": "qq", "back": 10.5},
               {"kind": "found", "t": 18.0, "client": "q", "wing": "amqp", "started": 18.0},
               {"kind": "queue_back", "t": 18.2, "queue": "qq", "back": 18.2},
               {"kind": "queue_back", "t": 18.45, "queue": "qq", "back": 18.45},
               {"kind": "op", "t": 18.6, "client": "q", "ok": True},
               {"kind": "heal", "t": 30.0, "what": "cut-lb", "target": "rabbit-1"},
               {"kind": "writable", "t": 45.0, "fault_t": 10.0, "target": "rabbit-1", "missing": 0,
                "streams": {"qq": 10.5}}]
    report = check(history)
    assert report.ok and report.own == {"q": pytest.approx([0.4])}


def test_a_queue_client_that_resumed_before_its_probes_next_write_has_no_share_of_its_own() -> None:
    """q found the drop at 18 s and progressed at 18.1 s, before any fresh client (the probe) could write to qq
    again (25 s): it was no slower than a fresh client, so none of the wait is its own."""
    history = [{"kind": "uses", "t": 0.0, "client": "q", "stream": "qq"},
               {"kind": "op", "t": 9.3, "client": "q", "ok": True},
               {"kind": "fault", "t": 10.0, "what": "cut-lb", "target": "rabbit-1", "silent": True},
               {"kind": "queue_back", "t": 10.5, "queue": "qq", "back": 10.5},
               {"kind": "found", "t": 18.0, "client": "q", "wing": "amqp", "started": 18.0},
               {"kind": "op", "t": 18.1, "client": "q", "ok": True},
               {"kind": "queue_back", "t": 25.0, "queue": "qq", "back": 25.0},
               {"kind": "op", "t": 25.05, "client": "q", "ok": True},
               {"kind": "heal", "t": 30.0, "what": "cut-lb", "target": "rabbit-1"}]
    report = check(history)
    assert report.ok and report.own == {"q": pytest.approx([0.0])}


def test_a_queue_client_whose_probe_had_stopped_is_timed_from_its_finding() -> None:
    """The probe wrote last at 44.9 s (15 s after the heal, it stops): q, which found its drop at 50 s and resumed at
    80 s, is timed from its finding (30 s of its own), not let off because no probe write came after it."""
    history = [{"kind": "uses", "t": 0.0, "client": "q", "stream": "qq"},
               {"kind": "op", "t": 9.3, "client": "q", "ok": True},
               {"kind": "fault", "t": 10.0, "what": "cut-lb", "target": "rabbit-1", "silent": True},
               {"kind": "queue_back", "t": 10.5, "queue": "qq", "back": 10.5},
               {"kind": "heal", "t": 30.0, "what": "cut-lb", "target": "rabbit-1"},
               {"kind": "queue_back", "t": 44.9, "queue": "qq", "back": 44.9},
               {"kind": "found", "t": 50.0, "client": "q", "wing": "amqp", "started": 50.0},
               {"kind": "op", "t": 80.0, "client": "q", "ok": True}]
    report = check(history)
    assert report.ok and report.own == {"q": pytest.approx([30.0])}


def test_a_later_faults_probe_counts_when_faults_overlap() -> None:
    """A connection close at 10, then a kill at 12 after which s1 took a write at 18: p's progress at 19 is 1 s of
    its own after either fault, not 9 s after the close."""
    history = [{"kind": "send", "t": 9.0, "client": "p", "id": 1},
               {"kind": "fault", "t": 10.0, "what": "close_connection", "target": ""},
               {"kind": "fault", "t": 12.0, "what": "kill", "target": "rabbit-1"},
               {"kind": "writable", "t": 18.1, "fault_t": 12.0, "target": "rabbit-1", "missing": 0,
                "streams": {"s1": 18.0}},
               {"kind": "confirm", "t": 19.0, "client": "p", "id": 1},
               {"kind": "stored", "t": 20.0, "stream": "s1", "offset": 0, "client": "p", "id": 1}]
    report = check(history)
    assert report.progress == {"p": pytest.approx([9.0, 7.0])} and report.own == {"p": pytest.approx([1.0, 1.0])}


def test_a_queues_producer_is_checked_against_what_its_consumers_received_at_least_once() -> None:
    """An AMQP 1.0 quorum queue's publisher: each confirmed id received at least once; received again is counted
    (redelivered), not a failure; one never received is lost; one received that was never sent is unexplained."""
    base = [{"kind": "send", "t": i / 10, "client": "q-p", "id": i} for i in range(1, 6)]
    base += [{"kind": "confirm", "t": i / 10 + 0.05, "client": "q-p", "id": i} for i in range(1, 6)]
    got = [{"kind": "received", "t": 1 + i / 10, "client": "q-c", "producer": "q-p", "id": i}
           for i in [1, 2, 3, 3, 4, 5]]
    report = check(base + got)
    assert report.ok and report.lost == 0 and report.producers["q-p"].redelivered == 1
    assert "1 id(s) received more than once" in report.summary()
    report = check(base + [r for r in got if r["id"] != 4] + [{"kind": "received", "t": 3, "client": "q-c",
                                                                 "producer": "q-p", "id": 9}])
    assert not report.ok and report.producers["q-p"].lost == [4] and report.producers["q-p"].unexplained == [9]
