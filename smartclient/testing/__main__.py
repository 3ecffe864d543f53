"""``python -m smartclient.testing up|down|status|provision|brokers N|nemesis|soak|spark up|connect|down|status``:
drive the test bed from a shell."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from smartclient._errors import SmartClientError
from smartclient.testing import from_env
from smartclient.testing.layout import NETWORKS
from smartclient.testing.local import LocalTestBed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smartclient.testing", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="provision and start everything (idempotent), then print the status table")
    down = sub.add_parser("down", help="stop everything the local test bed started")
    down.add_argument("--wipe", action="store_true", help="also delete node data")
    status = sub.add_parser("status", help="print the status table")
    for command in (up, down, status):
        command.add_argument("--network", choices=NETWORKS, default=None,
                             help="loopback (the default): every node on 127.0.0.1; namespaces: each node in a "
                                  "network namespace of its own, reached only through the load balancer "
                                  "(SMARTCLIENT_TESTBED_NETWORK)")
    up.add_argument("--routable", action="store_true", help="namespaces: the nodes may be dialled directly too, not "
                    "only through the load balancer (SMARTCLIENT_TESTBED_ROUTABLE=1)")
    sub.add_parser("provision", help="build the RabbitMQ chroot if it is not cached, and start nothing")
    brokers = sub.add_parser("brokers", help="start N extra independent single-node brokers")
    brokers.add_argument("count", type=int)
    nemesis = sub.add_parser("nemesis", help="run the stream workload under randomized faults, then check it")
    nemesis.add_argument("--minutes", type=float, default=3.0)
    nemesis.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one)")
    nemesis.add_argument("--history", default=None, help="write the history here (JSON lines)")
    nemesis.add_argument("--check", default=None, metavar="HISTORY", help="only check a saved history")
    nemesis.add_argument("--faults", default=None, metavar="KIND,...",
                         help="draw only these faults (default: all): kill, stop_app, move_leader, close_connection, "
                              "lb_backend, lb_sessions, lb_restart, dns")
    soak = sub.add_parser("soak", help="a month of a service's life compressed: rolling restarts, churn, rotating "
                                       "credentials, resources accounted; then check it")
    soak.add_argument("--minutes", type=float, default=45.0)
    soak.add_argument("--seed", type=int, default=None, help="the faults' seed (default: a random one)")
    soak.add_argument("--history", default=None, help="write the history here (default: a temporary file)")
    soak.add_argument("--rollout-every", type=float, default=600.0, help="seconds between rolling restarts")
    soak.add_argument("--first-rollout", type=float, default=None, help="seconds until the first (default: half)")
    soak.add_argument("--trace-memory", action="store_true", help="tracemalloc on: where memory grew (slower)")
    soak.add_argument("--amqp10", action="store_true", help="the AMQP 1.0 publisher and consumer too")
    soak.add_argument("--trim-every", type=float, default=60.0,
                      help="seconds between two malloc_trim(0), as a long-lived service opts in (0: never)")
    spark = sub.add_parser("spark", help="the Spark standalone cluster (a master and two workers) on 127.0.0.1")
    spark.add_argument("action", choices=("up", "connect", "down", "status"))
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")

    try:
        if args.command == "spark":
            return _spark(args.action)
        if getattr(args, "network", None):
            os.environ["SMARTCLIENT_TESTBED_NETWORK"] = args.network
        if getattr(args, "routable", False):
            os.environ["SMARTCLIENT_TESTBED_ROUTABLE"] = "1"
        bed = from_env()
        if args.command == "up":
            if isinstance(bed, LocalTestBed):
                report = bed.up()
                state = "; ".join(report.actions) or "reused the healthy running test bed"
                print(f"test bed up in {report.total:.1f}s (provision {report.provision:.1f}s, cluster "
                      f"{report.cluster:.1f}s, LB {report.lb:.1f}s, DNS {report.dns:.1f}s): {state}\n")
            print(bed.status_table())
        elif args.command == "down":
            if isinstance(bed, LocalTestBed):
                bed.down(wipe=args.wipe)
            print("test bed stopped")
        elif args.command == "status":
            print(bed.status_table())
        elif args.command == "provision":
            if isinstance(bed, LocalTestBed):
                took = bed.chroot.provision()
                print(f"RabbitMQ {bed.chroot.rabbitmq_version()} in {bed.chroot.root}: "
                      + (f"provisioned in {took:.1f}s" if took else "cached"))
        elif args.command == "nemesis":
            return _nemesis(bed, args)
        elif args.command == "soak":
            return _soak(bed, args)
        elif args.command == "brokers":
            for node in bed.start_brokers(args.count):
                print(f"{node.name}: amqp {node.amqp_port}, stream {node.stream_port}, "
                      f"management {node.management_port}")
    except SmartClientError as exc:
        print(f"smartclient test bed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


def _spark(action: str) -> int:
    from smartclient.testing.spark_cluster import SparkCluster
    from smartclient.testing.spark_connect import ConnectServer

    cluster = SparkCluster.from_env()
    server = ConnectServer(cluster)
    if action == "connect":
        started = time.monotonic()
        fresh = server.start()
        print(f"Spark Connect server {server.url} {'started' if fresh else 'already running'} "
              f"({time.monotonic() - started:.1f}s), on the cluster's master\n")
    elif action == "up":
        started = time.monotonic()
        done = cluster.start()
        print(f"Spark cluster up in {time.monotonic() - started:.1f}s: "
              f"{'; '.join(done) or 'reused the running cluster'}\n")
    elif action == "down":
        server.stop()  # (it holds the cluster's executors)
        cluster.stop()
        print("Spark cluster stopped")
        return 0
    print(cluster.status_table())
    return 0


def _nemesis(bed: object, args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    import random

    from smartclient.testing.checker import check, read_history
    from smartclient.testing.nemesis import Plan, run

    if args.check:
        report = check(read_history(args.check))
    else:
        seed = args.seed if args.seed is not None else random.randrange(1 << 31)
        plan = Plan(minutes=args.minutes, seed=seed, amqp10=True)
        if args.faults:
            plan = dataclasses.replace(plan, kinds=tuple(k.strip() for k in args.faults.split(",") if k.strip()))
        print(f"nemesis: {args.minutes:g} min, seed {seed}, faults {', '.join(plan.kinds)}")
        if isinstance(bed, LocalTestBed):
            bed.up()
        report = asyncio.run(run(bed, plan, args.history, progress=print))
    print(report.summary())
    print(f"nemesis: lost={report.lost} dup={report.duplicated} gaps={report.consumer_gaps} "
          f"{'OK' if report.ok else 'ANOMALY'}")
    return 0 if report.ok else 1


def _soak(bed: object, args: argparse.Namespace) -> int:
    import asyncio
    import random
    import tempfile

    from smartclient.testing.soak import SoakPlan, soak

    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    plan = SoakPlan(minutes=args.minutes, seed=seed, rollout_every=args.rollout_every, first_rollout=args.first_rollout,
                    trace_memory=args.trace_memory, amqp10=args.amqp10, trim_every=args.trim_every or None)
    history = args.history or tempfile.mkstemp(prefix="soak-", suffix=".jsonl")[1]
    print(f"soak: history in {history}")
    if isinstance(bed, LocalTestBed):
        bed.up()
    report = asyncio.run(soak(bed, plan, history, progress=lambda line: print(line, flush=True)))
    print(report.summary())
    print(f"soak: lost={report.report.lost} dup={report.report.duplicated} gaps={report.report.consumer_gaps} "
          f"resources {'flat' if report.resources.flat(plan.rss_growth) else 'NOT FLAT'} "
          f"{'OK' if report.ok else 'ANOMALY'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
