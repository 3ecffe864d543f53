"""The operator's pre-stop check before a node of a rolling restart goes, and what makes the broker's own crash.

``rabbitmq-upgrade await_online_quorum_plus_one`` lists the node's streams and asks the stream coordinator for each
one's members.  It crashes (``{badmatch,{error,not_found}}`` in ``rabbit_stream_queue:list_with_minimum_quorum``,
exit 69) on a stream record the coordinator no longer knows, and goes on crashing, on every node, until the record
is gone.  A deletion cut by a fault leaves one: the coordinator forgets the stream, then the record's own deletion
times out (``rabbit_stream_coordinator:delete_stream``).  Such a record holds no data, and deleting it again is
idempotent (the coordinator answers ``ok`` for a stream it does not know).
"""

from __future__ import annotations

import json
import logging
import time

from smartclient._errors import TestBedError
from smartclient.testing.broker import BrokerProcess

log = logging.getLogger(__name__)

_ORPHANS = ('io:format("~ts~n", [rabbit_json:encode([[amqqueue:get_vhost(Q), '
            'element(4, amqqueue:get_name(Q))] || Q <- rabbit_amqqueue:list_local_stream_queues(), '
            'case rabbit_stream_coordinator:members(maps:get(name, amqqueue:get_type_state(Q))) of '
            '{ok, _} -> false; _ -> true end])]).')


def await_quorum_plus_one(broker: BrokerProcess, timeout: float = 120.0) -> None:
    """Wait until ``broker``'s node can stop without costing any quorum queue or stream its quorum.  While the
    broker's check crashes on stream records without a stream, they are deleted and the check asked again.  Any
    other failure, or one past ``timeout``, is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            broker.tool("rabbitmq-upgrade", ["await_online_quorum_plus_one", "-t", str(int(timeout))],
                        timeout=timeout + 30)
            return
        except TestBedError as exc:
            if "list_with_minimum_quorum" not in str(exc) or time.monotonic() >= deadline:
                raise
            removed = remove_orphan_streams(broker)
            log.warning("%s: the pre-stop check crashed; stream records without a stream removed: %s",
                        broker.spec.name, removed or "none (asking again)")
        time.sleep(1.0)  # the check's retry interval, within the deadline above


def orphan_streams(broker: BrokerProcess) -> list[tuple[str, str]]:
    """``(vhost, stream)`` of each stream record on ``broker``'s node that the stream coordinator does not know."""
    out = broker.ctl(["eval", _ORPHANS])
    line = next((ln for ln in out.splitlines() if ln.startswith("[")), "[]")
    return [(str(vhost), str(stream)) for vhost, stream in json.loads(line)]


def remove_orphan_streams(broker: BrokerProcess) -> list[tuple[str, str]]:
    """Delete the stream records on ``broker``'s node that the stream coordinator does not know; return them."""
    orphans = orphan_streams(broker)
    for vhost, stream in orphans:
        broker.ctl(["delete_queue", "-p", vhost, stream])
    return orphans
