"""The short version of ``bench/scale.py --fleet`` (``smartclient.testing.fleet``): a few service processes, each a
producer and a single active consumer on every partition of one super stream through the round-robin LB, lose a
node at once (``kill -9``); every handle of every process comes back.  The times, dials and Metadata requests are
printed, not asserted: their targets are the bench's."""

from __future__ import annotations

import pytest

from smartclient.testing import TestBed
from smartclient.testing.fleet import fleet_round


@pytest.mark.faults
def test_a_fleet_that_loses_a_node_at_once_gets_every_handle_back(rabbitmq_faulty_testbed: TestBed) -> None:
    bed = rabbitmq_faulty_testbed  # (a bed that cannot kill a node says so, typed: TestBed.kill_node)
    result = fleet_round(bed, 4, bed.nodes[1].name, partitions=5, jitter=0.5)
    print(result.line())
    assert result.handles == 4 * 5 * 2
    assert result.failed == 0 and result.back, result.line()
    # the handles on the killed node came back (a third or so of them: leaders and consumers it held)
    assert 0 < len(result.back) <= result.handles
    # each handle back has its own time too (after its partition had a live leader again), never more than its time
    # after the kill; the killed node led at least one of the five partitions only by chance, so no election is asked
    assert len(result.own) == len(result.back) and result.own_p99 <= result.p99 and result.election >= 0
