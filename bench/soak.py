"""bench/soak.py: a long-lived service's month compressed into 45 minutes, checked (issue 32).

The workload is :mod:`smartclient.testing.soak`: the nemesis's whole workload through the LB (named producers,
plain, tracked, single-active and super-stream consumers, an AMQP RPC loop, an MQTT fleet), connection churn
(handles, streams and a super stream's consumers coming and going), an Environment on 60 s OAuth2 tokens and one
on a client certificate rotated every 5 minutes, a rolling restart every 10 minutes (``stop_app`` and full
restarts in turn, each node waited on as the Kubernetes operator does), and now and then a leader move, a
connection close or the LB's sessions cut.  It prints:

* lost, duplicated and consumer gaps;
* per rolling restart, the p99 and worst progress after a node stops, and the clients' own share (from when the
  stream took a write again: a raw producer's first confirm, side by side in the same run, is the anchor);
* every resource's start, baseline, peak and end (RSS, descriptors, tasks, threads, each table, metric sets).

Target: lost=0 dup=0 and no gap, resources flat (RSS < +5 %, every count back to its baseline after each
rollout), and the clients' own p99 after a fault <= 1 s.
Run from the repository root (it brings the test bed up): python bench/soak.py [--minutes M] [--seed S]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time

from smartclient.testing import from_env
from smartclient.testing.local import LocalTestBed
from smartclient.testing.soak import Rollout, SoakPlan, soak

TARGET_OWN_P99 = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=45.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--history", default=None, help="where to write the history (default: a temporary file)")
    parser.add_argument("--rollout-every", type=float, default=600.0)
    parser.add_argument("--amqp10", action="store_true", help="the AMQP 1.0 publisher and consumer too")
    parser.add_argument("--trim-every", type=float, default=60.0,
                        help="seconds between two malloc_trim(0) (smartclient.allocator.return_free_memory, as a "
                             "long-lived service opts in); 0: never, glibc keeps its free memory")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("smartclient.stream.handles").setLevel(logging.INFO)  # each failed recovery attempt, why
    bed = from_env()
    if isinstance(bed, LocalTestBed):
        bed.up()
    history = args.history or tempfile.mkstemp(prefix="soak-", suffix=".jsonl")[1]
    plan = SoakPlan(minutes=args.minutes, seed=seed, rollout_every=args.rollout_every, amqp10=args.amqp10,
                     trim_every=args.trim_every or None)
    print(f"soak bench: {args.minutes:g} min, seed {seed}, RabbitMQ {bed.rabbitmq_version()}, history {history}",
          flush=True)
    started = time.monotonic()
    result = asyncio.run(soak(bed, plan, history, progress=lambda line: print(line, flush=True)))
    report, resources = result.report, result.resources
    print(result.summary())
    confirmed = sum(p.confirmed for p in report.producers.values())
    print(f"{time.monotonic() - started:.0f} s: {confirmed} confirmed, lost {report.lost}, duplicated "
          f"{report.duplicated}, consumer gaps {report.consumer_gaps}; faults {dict(sorted(report.faults.items()))}")
    every = [t for r in result.rollouts for t in r.progress]
    print(f"rolling restarts: {len(result.rollouts)}, {sum(r.rolled for r in result.rollouts)} node rolls, "
          f"{result.rolls_failed} failed; progress after a node stop p99 {Rollout.p99(every):.2f} s, "
          f"worst {max(every, default=0.0):.2f} s; streams writable again (the anchor: a raw producer's first "
          f"confirm) median {sorted(report.unwritable)[len(report.unwritable) // 2] if report.unwritable else 0:.2f} s")
    own = report.p99_own()
    print(f"the clients' own share after a fault: p99 {own:.2f} s, worst {max(report.own_times(), default=0.0):.2f} s; "
          f"all of it: p99 {report.p99_progress():.2f} s (ratio own/all {own / (report.p99_progress() or 1):.2f})")
    flat = resources.flat(plan.rss_growth)
    ok = report.ok and flat and own <= TARGET_OWN_P99 and not result.rolls_failed
    print(f"soak: own_p99={own:.2f}s target <= {TARGET_OWN_P99:g}s with lost=0 dup=0 gaps=0 rolls_failed=0 flat "
          f"resources (lost={report.lost} dup={report.duplicated} gaps={report.consumer_gaps} rolls_failed="
          f"{result.rolls_failed} rss={resources.rss_growth * 100:+.1f}% "
          f"{'flat' if flat else 'not flat: ' + ','.join(sorted(resources.not_back))}) {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
