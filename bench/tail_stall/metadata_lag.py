"""After an election, does one node's Metadata name a stream's leader later than another's, and than the stream can
take a write?  (Issue 32: in the 45-minute soak on ``b0e74c1``, ten clients' topology reads were still told "no leader
available yet" about 2 s after their streams had confirmed a probe's write.)

The broker answers Metadata from its own node's copy of the stream coordinator's state
(``rabbit_stream_manager:topology`` -> ``rabbit_stream_coordinator:members``, a Ra *local* query), which names a
member the leader only once that copy has the writer ``running``; a publisher is declared against the queue
record's leader pid instead (``lookup_leader``).  So a node whose copy trails could name no leader after the stream
is writable.

Here: streams led by each node; then a rolling restart's steps (each node in turn, ``stop_app`` or a full restart,
``bed.roll_node``).  From each stop, every node that is up is asked Metadata for every stream every 20 ms (one
connection per node, reopened when it fails, each request bounded to 1 s), and a raw producer probes each stream
(``smartclient.testing.probe``).  Per stream and step it prints when the stream took a write, and when each node
first named a leader other than the stopped node.

    .venv/bin/python bench/tail_stall/metadata_lag.py [--streams 6] [--rolls 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("SMARTCLIENT_TESTBED_RABBITMQ", "4.3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from smartclient.core.address import Address
from smartclient.testing import from_env
from smartclient.testing.probe import writable_back
from smartclient.testing.streams import create_stream_led_by, delete_streams, raw_stream_client

POLL = 0.02


class History:
    """What ``writable_back`` records, kept in memory."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def add(self, kind: str, **fields: Any) -> float:
        t = time.monotonic()
        self.records.append({"kind": kind, "t": t, **fields})
        return t


async def poll_node(bed: Any, node: Any, streams: list[str], stop: asyncio.Event,
                    answers: list[tuple[float, str, str, Address | None]], errors: dict[str, int]) -> None:
    """Ask ``node`` Metadata for each stream every :data:`POLL` s until ``stop``; record each answer (the leader
    named, or None for "no leader")."""
    while not stop.is_set():
        try:
            async with raw_stream_client(bed, node.host, node.stream_port, name="metadata-lag") as client:
                while not stop.is_set():
                    for s in streams:
                        try:
                            leader, _ = await asyncio.wait_for(client.query_leader_and_replicas(s), 1.0)
                        except asyncio.TimeoutError:
                            errors[node.name] = errors.get(node.name, 0) + 1
                            raise
                        except Exception as exc:  # no leader yet (LeaderNotAvailable), or the stream not available
                            if "Leader" not in type(exc).__name__ and "NotAvailable" not in type(exc).__name__:
                                raise
                            answers.append((time.monotonic(), node.name, s, None))
                            continue
                        answers.append((time.monotonic(), node.name, s, Address(leader.host, leader.port)))
                    await asyncio.sleep(POLL)
        except Exception:  # the node going or down, or a request not answered: a new connection
            await asyncio.sleep(0.1)


async def step(bed: Any, streams: list[str], node: Any, full: bool,
               answers: list[tuple[float, str, str, Address | None]]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    history = History()
    probes: list[Any] = []
    healed = asyncio.Event()
    start_box: list[float] = []

    def stopping() -> None:
        start_box.append(time.monotonic())
        probes.append(asyncio.run_coroutine_threadsafe(
            writable_back(bed, streams, start_box[0], history, victim=node.name, healed=healed), loop))

    down = await asyncio.to_thread(bed.roll_node, node.name, full, stopping)
    healed.set()
    for probe in probes:
        await asyncio.wrap_future(probe)
    writable = next(r for r in history.records if r["kind"] == "writable")
    await asyncio.sleep(3)  # what the nodes say after the last stream took a write
    t0 = start_box[0]
    late: dict[tuple[str, str], float] = {}  # (node, stream) -> last "no leader" after the stream took a write
    for t, n, s, leader in answers:
        w = writable["streams"].get(s)
        if t > t0 and w is not None and t > w and leader is None:
            late[(n, s)] = max(late.get((n, s), 0.0), t - w)
    return {"node": node.name, "full": full, "down": down,
            "writable": {s: t - t0 for s, t in writable["streams"].items()}, "late": late}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--rolls", type=int, default=3, help="rolling-restart steps (nodes in turn)")
    args = parser.parse_args()
    bed = from_env()
    streams = [f"metadata-lag-{int(time.time())}-{i}" for i in range(args.streams)]
    for i, s in enumerate(streams):
        await create_stream_led_by(bed, s, i % len(bed.nodes))
    answers: list[tuple[float, str, str, Address | None]] = []
    stop = asyncio.Event()
    errors: dict[str, int] = {}
    pollers = [asyncio.create_task(poll_node(bed, n, streams, stop, answers, errors)) for n in bed.nodes]
    worst: list[float] = []
    try:
        for k in range(args.rolls):
            node = bed.nodes[k % len(bed.nodes)]
            full = k % 2 == 1
            r = await step(bed, streams, node, full, answers)
            print(f"\n{node.name} {'full restart' if full else 'stop_app'}: down {r['down']:.1f} s")
            print(f"  {'stream':<28} {'writable':>9}  last 'no leader' after that, by node")
            for s in streams:
                w = r["writable"].get(s)
                late = {n: t for (n, s2), t in r["late"].items() if s2 == s}
                worst.append(max(late.values(), default=0.0))
                print(f"  {s[-28:]:<28} {w if w is not None else float('nan'):>9.2f}  "
                      + (", ".join(f"{n.split('@')[0]} +{t:.2f} s" for n, t in sorted(late.items())) or "none"))
        print(f"\nrequests unanswered in 1 s: {errors or 'none'}")
    finally:
        stop.set()
        await asyncio.gather(*pollers, return_exceptions=True)
        await delete_streams(bed, *streams)
    worst.sort()
    print(f"\nper stream and step, the last node answering 'no leader' after the stream took a write: median "
          f"+{statistics.median(worst):.2f} s, worst +{worst[-1]:.2f} s, over 0.5 s: "
          f"{sum(1 for x in worst if x > 0.5)} of {len(worst)}")


if __name__ == "__main__":
    asyncio.run(main())
