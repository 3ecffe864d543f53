"""The nodes found cut off lately, shared by an Environment's wings: what one wing finds, the connections the others
placed there before leave, and new ones avoid (AMQP 0.9.1's, AMQP 1.0's and MQTT's use of it: their own tests)."""

from __future__ import annotations

from smartclient.core.address import Address
from smartclient.core.broker_nodes import CutOffNodes, reconnect_candidates


def test_a_finding_ends_what_was_placed_before_it_and_is_avoided_for_its_seconds() -> None:
    now = [100.0]
    cut = CutOffNodes(30.0, clock=lambda: now[0])
    assert cut.ends("a@h", 90.0) is None and cut.avoided() == set()
    assert cut.found("a@h", "the queue watch of c1")
    now[0] = 105.0
    assert cut.ends("a@h", 99.0) == "the queue watch of c1"  # placed before the finding
    assert cut.ends("a@h", 101.0) is None  # placed after it (the only node left, say): kept
    assert cut.ends("b@h", 0.0) is None and cut.ends(None, 0.0) is None
    assert cut.avoided() == {"a@h"}
    # the connections it ended find it again as they go: the same finding, its time the first's
    assert not cut.found("a@h", "the queue watch of c2")
    assert cut.ends("a@h", 101.0) is None and cut.ends("a@h", 99.0) == "the queue watch of c1"
    assert not cut.found(None, "a client whose node is not known")
    now[0] = 130.0  # 30 s after it: forgotten
    assert cut.avoided() == set() and cut.ends("a@h", 99.0) is None
    assert cut.found("a@h", "the PUBACK watch of m")  # a new finding
    assert cut.ends("a@h", 120.0) == "the PUBACK watch of m"


def test_a_reconnect_takes_a_node_found_cut_off_only_with_the_one_it_left() -> None:
    a, b, c = Address("a", 1), Address("b", 1), Address("c", 1)
    assert reconnect_candidates((a, b, c), a).tiers == ((b, c), (a,))
    assert reconnect_candidates((a, b, c), a, avoid={b}).tiers == ((c,), (b, a))
    assert reconnect_candidates((a, b, c), a, avoid={b, c}).tiers == ((b, c, a),)
    assert reconnect_candidates((a, b, c), None, avoid={b}).tiers == ((a, c), (b,))
    assert reconnect_candidates((a, b, c), None, avoid={a, b, c}).tiers == ((a, b, c),)


def test_a_connection_whose_node_is_not_known_ends_at_any_finding_since_it_was_placed() -> None:
    now = [100.0]
    cut = CutOffNodes(30.0, clock=lambda: now[0])
    assert cut.any_after(90.0) is None
    cut.found("a@h", "the PUBACK watch of m")
    now[0] = 110.0
    cut.found("b@h", "the queue watch of c")
    assert cut.any_after(105.0) == "the queue watch of c"  # the latest
    assert cut.any_after(90.0) == "the queue watch of c"
    assert cut.any_after(111.0) is None
    now[0] = 135.0  # a@h's forgotten, b@h's not yet
    assert cut.any_after(90.0) == "the queue watch of c"


def test_findings_read_and_made_from_many_threads_neither_raise_nor_lose_a_finding() -> None:
    import threading

    now = [0.0]
    cut = CutOffNodes(1.0, clock=lambda: now[0])  # every finding expires as the clock moves
    errors: list[BaseException] = []

    def hammer(i: int) -> None:
        try:
            for k in range(2000):
                now[0] += 0.01
                cut.found(f"n{k % 5}@h", f"t{i}")
                cut.avoided()
                cut.ends(f"n{(k + i) % 5}@h", now[0] - 0.5)
                cut.any_after(now[0] - 0.5)
        except BaseException as exc:  # (noted, then asserted on the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cut.found("fresh@h", "x") and cut.avoided() >= {"fresh@h"}  # a new finding is kept
