"""bench/nemesis.py: 10 minutes of randomized mixed faults under smartclient's whole workload, checked.

The workload and the schedule are :mod:`smartclient.testing.nemesis` (named producers with ``send()`` and
``send_many()``, a super stream, plain, tracked, single-active and super-stream consumers, an AMQP RPC loop and
an MQTT fleet, all through the round-robin LB) with a random seed, printed so that a run can be repeated.
The anchor runs beside it under the same faults: a raw rstream named producer (its own recovery) on a stream
of its own, through a node's address.  The checker reads every stream back and prints:

* messages confirmed, lost and duplicated (smartclient, and the anchor apart);
* faults injected, by kind;
* the worst and p99 time to progress after a fault, and its ratio to the anchor's.

Target (issue 18): lost=0 dup=0 for smartclient, and p99 progress under 5 s.
Run from the repository root (it brings the test bed up): python bench/nemesis.py [--minutes M] [--seed S]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sys
import time
from typing import Any

from smartclient.testing import from_env
from smartclient.testing.checker import ANCHOR
from smartclient.testing.local import LocalTestBed
from smartclient.testing.nemesis import History, Plan, run

TARGET_P99 = 5.0


async def rstream_anchor(bed: Any, stream: str, history: History, stop: asyncio.Event, rate: float) -> None:
    """A raw rstream named producer, as a user without smartclient would write it."""
    from rstream import AMQPMessage, ConfirmationStatus, Producer

    client = f"{ANCHOR}rstream"

    def on_publish(status: ConfirmationStatus) -> None:
        if status.is_confirmed:
            history.add("confirm", client=client, id=status.message_id)
        else:
            history.add("fail", client=client, id=status.message_id, reason=f"code {status.response_code}",
                        code=int(status.response_code or -1))

    entry = bed.nodes[0]
    async with Producer(entry.host, entry.stream_port, username=bed.username, password=bed.password) as producer:
        next_id = 1
        while not stop.is_set():
            message = AMQPMessage(body=f"{client}:{next_id}".encode())
            message.publishing_id = next_id  # rstream's AMQPMessage takes it as an attribute only
            try:
                await asyncio.wait_for(producer.send(stream, message, publisher_name="nemesis-anchor",
                                                     on_publish_confirm=on_publish), 10)
            except Exception as exc:  # rstream raises while its publisher is gone: that one was not sent
                history.add("refused", client=client, id=next_id, reason=f"{type(exc).__name__}")
            else:
                history.add("send", client=client, id=next_id)
            next_id += 1
            await asyncio.sleep(1.0 / rate)
        await asyncio.sleep(10)  # rstream has no flush that ends: leave its confirms time to come


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--history", default=None)
    parser.add_argument("--faults", default=None, help="draw only these fault kinds, comma-separated (default: all)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    bed = from_env()
    if isinstance(bed, LocalTestBed):
        bed.up()
    print(f"nemesis bench: {args.minutes:g} min, seed {seed}, RabbitMQ {bed.rabbitmq_version()}", flush=True)
    started = time.monotonic()
    plan = Plan(minutes=args.minutes, seed=seed, amqp10=True)
    if args.faults:
        plan = dataclasses.replace(plan, kinds=tuple(k.strip() for k in args.faults.split(",") if k.strip()))
    report = asyncio.run(run(bed, plan, args.history,
                             progress=lambda line: print(line, flush=True), anchor=rstream_anchor))
    print(report.summary())
    confirmed = sum(p.confirmed for n, p in report.producers.items() if not n.startswith(ANCHOR))
    faults = sum(report.faults.values())
    p99, anchor_p99 = report.p99_progress(), report.p99_progress(anchor=True)
    ratio = p99 / anchor_p99 if anchor_p99 else float("nan")
    print(f"{time.monotonic() - started:.0f} s: {confirmed} confirmed, lost {report.lost}, duplicated "
          f"{report.duplicated}, consumer gaps {report.consumer_gaps}; {faults} faults "
          f"{dict(sorted(report.faults.items()))}")
    print(f"progress after a fault: smartclient worst {report.worst_progress():.2f} s, p99 {p99:.2f} s; "
          f"anchor (raw rstream) worst {report.worst_progress(True):.2f} s, p99 {anchor_p99:.2f} s, lost "
          f"{report.count('lost', True)}, duplicated {report.count('duplicated', True)}; ratio p99 {ratio:.2f}")
    if report.elections:
        print(f"broker: every leader named again after a node fault in {sorted(report.elections)[-1]:.2f} s at worst; "
              f"smartclient's progress after that: p99 {report.p99_beyond_broker():.2f} s")
    if report.unwritable:
        print(f"streams writable again (a raw producer's first confirm) after a node fault or leader move: worst "
              f"{max(report.unwritable):.2f} s; the clients' own share after that: smartclient p99 "
              f"{report.p99_own():.2f} s (total p99 {p99:.2f} s), anchor p99 {report.p99_own(anchor=True):.2f} s")
    ok = report.lost == 0 and report.duplicated == 0 and p99 < TARGET_P99 and report.ok
    print(f"nemesis: p99_progress={p99:.2f}s target < {TARGET_P99:g}s with lost=0 dup=0 (lost={report.lost} "
          f"dup={report.duplicated}) {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
