"""What an Environment holds, counted: the tables a service that runs for weeks must not let grow.

:func:`resources` counts every table smartclient keeps per connection, handle, stream or node, and the ones it
drives in rstream (its carriers' publishers and subscribers, each connection's handlers, delivery queues, tasks
and waiters), so that a soak can show each comes back to its baseline after connections churn, streams come and
go and nodes restart (``smartclient.testing.soak``).  Reading it takes no lock and changes nothing; call it on
the Environment's event loop.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from smartclient.core.topology import Role
from smartclient.stream import _rstream

__all__ = ["resources"]


def resources(env: Any) -> dict[str, int]:
    """The sizes of an Environment's tables, by name (see :meth:`smartclient.stream.wing.StreamWing.resources`)."""
    connector, carriers, placement, topologies = env.connector, env._carriers, env._placement, env._topologies
    counts: Counter[str] = Counter()
    counts["connections"] = len(connector.connections)
    counts["parked connections"] = len(connector.parking)
    counts["parked connections not alive"] = sum(1 for c in connector.parking.all() if not c.alive())
    counts["parked connections past their idle time"] = sum(
        1 for c in connector.parking.all()
        if c.parked_at is None or c.parked_at < time.monotonic() - 2 * connector.limits.idle_timeout - 1)
    counts["reaper running"] = int(connector._reaper is not None and not connector._reaper.done())
    counts["connections parked twice (events)"] = connector.parking.parked_twice
    counts["stale parking entries (events)"] = connector.parking.stale
    counts["shared connections"] = sum(len(c) for c in placement.shared.values())
    counts["dialled targets"] = len(connector.dialled)
    counts["handles"] = len(carriers.handles)
    counts["placement records"] = len(placement.records)
    counts["placement locks"] = len(placement._locks)
    counts["recoveries under way"] = sum(1 for n in placement.recovering.values() if n)
    counts["recovery keys"] = len(placement.recovering)
    counts["metadata cache entries"] = len(topologies._topologies) + len(topologies._routed)
    counts["metadata reads in flight"] = len(topologies._inflight)
    counts["committed-chunk cache entries"] = len(carriers._committed)
    counts["member reads kept fresh"] = len(carriers._ready_at) + len(carriers._fell_back) + len(carriers._chosen)
    counts["member reads under way"] = len(carriers._probes)
    counts["reading connections"] = len(carriers.reads)
    counts["known nodes"] = len(topologies._nodes)
    counts["streams gone, waiting for their last handle"] = len(carriers.gone)
    counts["closed subscriptions' counts"] = sum(len(totals) for totals in carriers.left.values())
    counts["background tasks"] = len(carriers._tasks)
    pending = 0
    for handle in carriers.handles:
        buffer = getattr(handle, "buffer", None)
        if buffer is not None:
            pending += buffer.in_flight
            counts["confirm waiters"] += buffer.waiting
    counts["pending confirms"] = pending
    live: dict[int, Any] = {}
    for conn in [*connector.connections, *connector.parking.all()]:
        live[id(conn.client)] = conn.client
        counts["connection ids in use"] += len(conn.ids)
        counts["connection forwards"] += len(conn.forwards)
    for role, entries in carriers._carriers.items():
        counts[f"{role.value} carriers"] += len(entries)
        for carrier, streams in entries:
            counts[f"{role.value} carrier streams"] += len(streams)
            if role is Role.CONSUMER:  # what it counted per stream is folded away when a subscription ends
                counted = {*getattr(carrier, "smartclient_consumed", ()), *getattr(carrier, "smartclient_chunks", ())}
                counts["consumer carrier counts of streams it no longer consumes"] += len(counted - streams)
            counts.update({f"{role.value} {k}": n for k, n in _rstream.carrier_tables(carrier).items()})
            live.update((id(client), client) for client in _rstream.carrier_clients(carrier))
    for client in live.values():
        counts.update(_rstream.client_tables(client))
    telemetry = carriers.telemetry
    if telemetry is not None:
        counts["retired handle totals"] = sum(len(c) for c in telemetry.retired.values())
    return dict(counts)


