"""The tail stall's cause, on demand (issue 32, item 4a): the broker's process of a stream connection waits, serving
nothing else, on any process it asks something of.

``rabbit_stream_reader`` runs one Erlang process per client connection, and some requests make it call another
process and wait for the answer:

* Subscribe (and a single active consumer's activation, and StreamStats) opens an osiris reader on the node's
  member: ``osiris_util:get_reader_context/1`` calls the member **with no time limit** unless the member has
  already put its context in a cache, which it does at the end of its initialisation;
* QueryOffset and QueryPublisherSequence call the stream's writer (``gen_batch_server:call``, 5 s): if it does not
  answer in time, the whole connection process crashes;
* a single active consumer's Subscribe and Unsubscribe (also the broker's own, when a member of its stream goes
  down) are commands to the stream coordinator, a Ra cluster: ``ra:process_command`` with 30 s on each coordinator
  server in turn (``rabbit_stream_coordinator:process_command``).

While it waits, that process serves nothing else: no delivery to the connection's other subscriptions, no answer
to any request, no MetadataUpdate.  Rolling restarts make both kinds of process slow to answer: a member just
started answers once it has initialised, and the coordinator elects a leader whenever its leader's node stops.
The 2-hour soak's one rescue (RabbitMQ 4.3.6, 03:48:32 to 03:49:02 in the node log of rabbit-3) was a connection
that served nothing for exactly 30.0 s, from rabbit-2's stop to ``Coordinator timeout on server
'rabbit-1@localhost' when processing command command_unregister_consumer``; the same minute's node logs show a new
writer 22.5 s in its initialisation, connections crashing with ``noproc`` in ``get_reader_context`` when a member
still initialising gave up, and QueryOffset crashing locator connections with ``timeout``.

Here, the layout is chosen against the coordinator's leader L: streams H (healthy, a producer on it) and S led by
node A, and the connections under test on node B (A, B and L all different).  Each phase opens connection K and a
control connection to the same node, each with a consumer of H, then holds a process (suspended by a process on
its node, ``smartclient.testing.streams``) and sends one request on K:

1. ``subscribe``: S's replica on B held as one initialising is (also out of osiris' cache); Subscribe to S on K;
2. ``member exits``: the same, but the held member is killed instead of let go: the broker closes K (``noproc``);
3. ``query offset``: S's writer on A held; QueryOffset on S on K (node L): after 5 s the broker closes K;
4. ``coordinator``: the coordinator's leader held; a single active consumer subscribes to S on K;
5. ``coordinator, stop_app``: no hold, a rolling restart's step: L is stopped (``stop_app``), and at once a single
   active consumer subscribes to S on K; then L is started again.

K's consumer of H gets nothing for as long as its request waits, while the control goes on.

Run with the bed up (4.3: port base 20000; ``SMARTCLIENT_TESTBED_RABBITMQ=4.0``: 23000)::

    .venv/bin/python bench/tail_stall/member_wait.py [--hold 6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("SMARTCLIENT_TESTBED_RABBITMQ", "4.3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from repro import all_nodes
from rstream import constants, schema

from smartclient import Environment
from smartclient.testing import from_env
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import (
    coordinator_leader,
    create_stream_led_by,
    delete_streams,
    hold_coordinator,
    hold_member,
    raw_stream_client,
)


class Watch:
    """One subscription to H on its own connection: when each chunk came."""

    def __init__(self, client: Any, sid: int, stream: str) -> None:
        self.client = client
        self.sid = sid
        self.stream = stream
        self.times: list[float] = []

    async def on_deliver(self, frame: Any) -> None:
        if frame.subscription_id == self.sid:
            self.times.append(time.monotonic())
            with contextlib.suppress(Exception):
                await self.client.credit(self.sid, 1)

    def longest_gap(self, start: float, end: float) -> float:
        marks = [start, *[t for t in self.times if start < t < end], end]
        return max(b - a for a, b in itertools.pairwise(marks))


async def watch(stack: contextlib.AsyncExitStack, bed: Any, node: int, stream: str, name: str) -> Watch:
    n = bed.nodes[node]
    client = await stack.enter_async_context(raw_stream_client(bed, n.host, n.stream_port, name))
    w = Watch(client, 0, stream)
    client.add_handler(schema.Deliver, w.on_deliver, name="0")
    await client.run_queue_listener_task(0, w.on_deliver)
    await client.subscribe(stream, 0, schema.OffsetSpec(constants.OffsetType.NEXT), initial_credit=10)
    return w


async def publish(env: Any, stream: str, stop: asyncio.Event) -> None:
    producer = await env.producer(stream)
    while not stop.is_set():
        await producer.send(b"h")
        await asyncio.sleep(0.02)


async def phase(title: str, k: Watch, control: Watch, held: str, seconds: float,
                request: Any) -> dict[str, Any]:
    """Send ``request`` on K (it waits on the held member), probe K with Metadata (which asks no member) every
    0.5 s, and measure K's and the control's longest silence."""
    start = time.monotonic()
    sent = asyncio.create_task(asyncio.wait_for(request, seconds + 10))
    answered: float | None = None
    probes = unanswered = 0
    closed_at: float | None = None
    while time.monotonic() - start < seconds + 4:
        if sent.done() and answered is None:
            answered = time.monotonic() - start
        if closed_at is None and not k.client.is_connection_alive():
            closed_at = time.monotonic() - start
        if closed_at is None:
            probes += 1
            try:
                await asyncio.wait_for(k.client.query_leader_and_replicas(k.stream), 0.5)
            except Exception:
                unanswered += 1
            else:
                await asyncio.sleep(0.25)
        else:
            await asyncio.sleep(0.5)
    end = time.monotonic()
    outcome = "no answer"
    if sent.done():
        exc = sent.exception()
        outcome = "answered" if exc is None else type(exc).__name__
    else:
        sent.cancel()
    k_end = start + closed_at if closed_at is not None else end
    row = {"phase": title, "held": held, "k_silent": round(k.longest_gap(start, k_end), 2),
           "control_silent": round(control.longest_gap(start, end), 2), "request": outcome,
           "request_s": answered and round(answered, 2), "metadata_unanswered": f"{unanswered}/{probes}",
           "k_closed_s": closed_at and round(closed_at, 2)}
    print("  ".join(f"{key}={value}" for key, value in row.items()), flush=True)
    return row


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=6.0, help="seconds a process is held")
    args = parser.parse_args()
    logging.getLogger("rstream").setLevel(logging.CRITICAL)  # the connections the broker closes, on purpose
    bed = from_env()
    if isinstance(bed, LocalTestBed):
        bed.up()
    version = bed.rabbitmq_version()
    leader = await asyncio.to_thread(coordinator_leader, bed)
    a, b = (leader + 1) % 3, (leader + 2) % 3
    print(f"member wait: RabbitMQ {version}, processes held {args.hold} s; the coordinator leads on node "
          f"{leader + 1}, streams led by node {a + 1}, connections under test on node {b + 1}", flush=True)
    tag = f"member-wait-{os.getpid()}"
    healthy, slow = f"{tag}-h", f"{tag}-s"
    await create_stream_led_by(bed, healthy, a)
    await create_stream_led_by(bed, slow, a)
    stop = asyncio.Event()
    rows = []
    sac = {"single-active-consumer": "true", "name": f"{tag}-sac"}
    try:
        async with Environment(all_nodes(bed)) as env, contextlib.AsyncExitStack() as stack:
            publisher = asyncio.create_task(publish(env, healthy, stop))

            async def pair(node: int, label: str) -> tuple[Watch, Watch]:
                k = await watch(stack, bed, node, healthy, f"{tag}-{label}-k")
                control = await watch(stack, bed, node, healthy, f"{tag}-{label}-control")
                await asyncio.sleep(1)
                return k, control

            k, control = await pair(b, "subscribe")
            held = (await asyncio.to_thread(hold_member, bed, b, slow, args.hold, "release", True)).pid
            rows.append(await phase("subscribe", k, control, held, args.hold,
                                    k.client.subscribe(slow, 1, initial_credit=10)))
            k, control = await pair(b, "exits")
            held = (await asyncio.to_thread(hold_member, bed, b, slow, args.hold, "kill", True)).pid
            rows.append(await phase("member exits", k, control, held, args.hold,
                                    k.client.subscribe(slow, 1, initial_credit=10)))
            await asyncio.sleep(8)  # the coordinator starts the member again
            k, control = await pair(leader, "offset")
            held = (await asyncio.to_thread(hold_member, bed, a, slow, args.hold)).pid
            rows.append(await phase("query offset", k, control, held, args.hold,
                                    k.client.query_offset(slow, f"{tag}-ref")))
            k, control = await pair(b, "coordinator")
            held = f"coordinator on node {await asyncio.to_thread(hold_coordinator, bed, args.hold) + 1}"
            rows.append(await phase("coordinator", k, control, held, args.hold,
                                    k.client.subscribe(slow, 1, initial_credit=10, properties=sac)))
            k, control = await pair(b, "stop-app")
            name = bed.nodes[leader].name
            await asyncio.to_thread(bed.broker(name).ctl, ["stop_app"], 120)
            try:
                rows.append(await phase("coordinator, stop_app", k, control, f"{name} stopped", args.hold,
                                        k.client.subscribe(slow, 2, initial_credit=10, properties=sac)))
            finally:
                await asyncio.to_thread(bed.broker(name).ctl, ["start_app"], 180)
            stop.set()
            await asyncio.gather(publisher, return_exceptions=True)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(bed.heal)
        await delete_streams(bed, healthy, slow)
    held_rows = rows[:4]
    reproduced = sum(1 for r in held_rows
                     if r["k_silent"] >= min(args.hold, 5.0) * 0.8 and r["control_silent"] < 1.0)
    print(f"natural (stop_app of the coordinator's node): K silent {rows[-1]['k_silent']} s, the control "
          f"{rows[-1]['control_silent']} s")
    print(f"member_wait: reproduced={reproduced} target == 4 {'PASS' if reproduced == 4 else 'MISS'} "
          f"(RabbitMQ {version}: a connection waiting on one held process serves none of its other consumers)")
    return 0 if reproduced == 4 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
