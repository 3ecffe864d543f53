"""bench/partitions.py: mixed partitions, healed, under smartclient's whole workload on the namespaced bed, checked.

The nodes sit in network namespaces of their own, and the client reaches them only through the load balancer
(``lb-only``).  A seeded schedule cuts one node at a time, silently (an nftables ``drop``, never a reset): from its
peers, from everyone, from the load balancer both ways or one way; each cut lasts 12-25 s, longer than any bound,
then heals.  The workload is the nemesis's (:mod:`smartclient.testing.nemesis`: named producers with ``send()`` and
``send_many()``, a super stream, plain, tracked, single-active and super-stream consumers, RPC, an MQTT fleet) with
AMQP 1.0 and AMQP 0.9.1 publishers and consumers on quorum queues and an MQTT QoS 1 publisher and subscriber
(:mod:`smartclient.testing.thread_loads`).  It prints:

* the checker's counts: streams lost and duplicated (each must be 0), the queues' and MQTT's lost (0; their
  redeliveries counted);
* when each silent drop was found, per wing, against its documented bound (docs/reliability.md);
* the clients' own recovery after the broker took writes again, measured as the soak does (p99 <= 1 s).

No anchor runs beside it: a raw client cannot reach a node in ``lb-only`` mode (it has no resolver), and through
the load balancer alone a named producer cannot reach its leader.

Run from the repository root (it brings the namespaced bed up): python bench/partitions.py [--minutes M] [--seed S]
It ends with ``partitions: own_p99=...s target <= 1s ... PASS`` (or MISS).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time

from smartclient.core.settings import ConnectionOptions
from smartclient.testing import from_env
from smartclient.testing.local import LocalTestBed
from smartclient.testing.nemesis import History, run
from smartclient.testing.partition_run import bounds, detections, plan, record_recoveries

TARGET_OWN_P99 = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--history", default=None, help="also write the history here (JSON lines)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    os.environ.setdefault("SMARTCLIENT_TESTBED_NETWORK", "namespaces")
    bed = from_env()
    if not isinstance(bed, LocalTestBed) or not bed.layout.namespaced:
        raise SystemExit("partitions: needs the namespaced test bed (SMARTCLIENT_TESTBED_NETWORK=namespaces)")
    bed.heal_partitions()  # (a run stopped mid-way leaves its cut: the cluster would not form again through it)
    bed.up()
    print(f"partitions bench: {args.minutes:g} min, seed {seed}, RabbitMQ {bed.rabbitmq_version()}, nodes "
          f"{', '.join(f'{n.short} {n.host}' for n in bed.nodes)} (lb-only)", flush=True)
    history = History(args.history)
    _log_on_clock(history.start)
    started = time.monotonic()
    report = asyncio.run(run(bed, plan(args.minutes, seed), progress=lambda line: print(line, flush=True),
                             extras=(record_recoveries,), history=history))
    print(report.summary())
    limits = bounds(ConnectionOptions().dead_after)
    found = detections(history.records, limits)
    for line in found.summary():
        print(line)
    streams_lost = sum(len(p.lost) for name, p in report.producers.items() if not _queue(name))
    queues_lost = sum(len(p.lost) for name, p in report.producers.items() if _queue(name))
    own = report.p99_own()
    print(f"{time.monotonic() - started:.0f} s: lost {report.lost} (streams {streams_lost}, queues and MQTT "
          f"{queues_lost}), duplicated {report.duplicated}, consumer gaps {report.consumer_gaps}; faults "
          f"{dict(sorted(report.faults.items()))}")
    print(f"the clients' own share after each stream took writes again: p99 {own:.2f} s, worst "
          f"{max(report.own_times(), default=0.0):.2f} s; progress after a fault p99 {report.p99_progress():.2f} s")
    for kind, shares in sorted(_by_kind(report.delays).items()):
        ordered = sorted(shares)
        p99 = ordered[min(len(ordered) - 1, -(-99 * len(ordered) // 100) - 1)]
        print(f"  {kind}: {len(ordered)} measured, p99 {p99:.2f} s, worst {ordered[-1]:.2f} s, over 1 s "
              f"{sum(1 for s in ordered if s > 1.0)}")
    ok = (report.lost == 0 and report.duplicated == 0 and not found.beyond and own <= TARGET_OWN_P99
          and report.ok and found.faults > 0)
    print(f"partitions: own_p99={own:.2f}s target <= {TARGET_OWN_P99:g}s with lost=0 dup=0 and every drop found "
          f"within its bound (lost={report.lost} dup={report.duplicated} beyond={len(found.beyond)}) "
          f"{'PASS' if ok else 'MISS'}")
    return 0


def _log_on_clock(start: float) -> None:
    """The library's warnings, each with its moment on the history's clock (``t``), to read beside the history."""
    class OnClock(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return f"{time.monotonic() - start:8.2f} {super().format(record)}"

    handler = logging.StreamHandler()
    handler.setFormatter(OnClock("%(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def _by_kind(delays: list[tuple[str, float, float, float]]) -> dict[str, list[float]]:
    """The own shares by kind of client: streams (producers and consumers), queues (AMQP 0.9.1 and 1.0, MQTT QoS 1:
    their own share is timed from when their queue's probe had a write settled), RPC and the MQTT fleet (timed from
    the heal: no probe follows them)."""
    kinds: dict[str, list[float]] = {}
    for client, _, _, share in delays:
        kind = ("queues" if client.startswith(("amqp", "mqtt-p", "mqtt-c")) else "rpc and MQTT fleet"
                if client.startswith(("rpc", "mqtt")) else "streams")
        kinds.setdefault(kind, []).append(share)
    return kinds


def _queue(producer: str) -> bool:
    return producer in ("amqp-p", "amqp10-p", "mqtt-p")


if __name__ == "__main__":
    sys.exit(main())
