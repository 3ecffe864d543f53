"""Hunt the tail stall through rolling restarts (issue 32, item 4a): many consumers on replicas, the delivery watch
off, and after each node's roll a look inside every node for a **subscription the broker kept on a member process
that is gone**.

The 2-hour soak's one rescue (RabbitMQ 4.3.6) showed a consumer on a replica with the broker's whole credit (10),
``offset_lag`` 0 and nothing delivered for 11 s, while the leader had committed 120 messages more; the stream's
member on the consumer's node had been replaced (a new replica process in a new epoch) and the client had been told
nothing (no MetadataUpdate).  A ``rabbit_stream_reader`` subscription reads through an osiris reader bound to one
member process: the member's shared committed offset, and offset listeners registered with that process.  If the
process is replaced and the subscription is not cleaned, the subscription waits on a dead member for ever.

Each check runs ``rabbitmqctl eval`` in every node: every ``rabbit_stream_reader`` consumer, its ``member_pid``,
whether that process is alive, whether the connection still monitors it, and the stream's local member now
(``rabbit_stream_manager:lookup_local_member``).  A consumer whose member is dead, unmonitored or not the local
member now is printed whole.  A consumer that received nothing for ``--silent`` seconds while its producer had
messages confirmed is a stall: the broker's view of its stream is printed (the same capture as ``repro.py``).

Run with the bed up (4.3: port base 20000; ``SMARTCLIENT_TESTBED_RABBITMQ=4.0``: 23000)::

    .venv/bin/python bench/tail_stall/rollout.py --rollouts 10 --streams 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import time
from typing import Any

os.environ.setdefault("SMARTCLIENT_TESTBED_RABBITMQ", "4.3")  # before repro, which defaults to 4.0
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from repro import all_nodes, broker_view, erl, node_index

from smartclient import Environment, RecoveryPolicy
from smartclient.testing import from_env
from smartclient.testing.footprint import node_sockets
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

# every stream consumer in this node whose member process is gone, unmonitored or not the local member now; and
# every stream with two members in this node (osiris names a writer's child by a binary, a replica's by a string)
ORPHANS = r"""
Rs = [P || P <- erlang:processes(),
      case erlang:process_info(P, dictionary) of
          {dictionary, D} -> proplists:get_value('$initial_call', D) =:= {rabbit_stream_reader, init, 1};
          _ -> false end],
Alive = fun(Pid) when node(Pid) =:= node() -> is_process_alive(Pid);
           (Pid) -> catch erpc:call(node(Pid), erlang, is_process_alive, [Pid], 3000) end,
Mons = fun(Conn) ->
    case [M || M <- tuple_to_list(Conn), is_map(M), map_size(M) > 0,
               lists:all(fun(V) -> is_tuple(V) andalso tuple_size(V) =:= 2 andalso is_pid(element(1, V))
                                   andalso is_binary(element(2, V)) end, maps:values(M))] of
        [M1 | _] -> maps:values(M1);
        [] -> [] end end,
All = lists:flatmap(fun(P) ->
    case catch sys:get_state(P, 3000) of
        {_, SD} when element(1, SD) =:= statem_data ->
            Ms = Mons(element(3, SD)),
            [begin
                 Cfg = element(2, C), St = element(5, Cfg), Mb = element(3, Cfg),
                 Now = case catch rabbit_stream_manager:lookup_local_member(<<"/">>, St) of
                           {ok, NP} -> NP; E -> E end,
                 L = element(5, C),
                 #{reader => P, sid => Sid, stream => St, member => Mb, alive => Alive(Mb),
                   monitored => lists:member({Mb, St}, Ms), local_member_now => Now,
                   credit => element(3, C), last_listener_offset => element(6, C),
                   log => case L of undefined -> undefined;
                              _ -> #{next_offset => catch osiris_log:next_offset(L),
                                     committed => catch osiris_log:committed_offset(L)} end,
                   consumed => catch atomics:get(element(7, Cfg), 1)}
             end || {Sid, C} <- maps:to_list(element(4, element(4, SD)))];
        _ -> [] end end, Rs),
Bad = [C || C <- All, maps:get(alive, C) =/= true orelse maps:get(monitored, C) =/= true
                       orelse maps:get(local_member_now, C) =/= maps:get(member, C)],
Kids = [case Id of B when is_binary(B) -> B; Li -> list_to_binary(Li) end
        || {Id, _, _, _} <- supervisor:which_children(osiris_server_sup)],
{length(All), Bad, lists:usort(Kids -- lists:usort(Kids))}.
"""


def orphans(bed: Any) -> dict[str, str]:
    """Each node's {consumers, suspicious consumers, streams with two members}, as the node printed it."""
    out: dict[str, str] = {}
    for node in bed.nodes:
        try:
            out[node.name] = bed.broker(node.name).ctl(["eval", erl(ORPHANS, "")], timeout=30).strip()
        except Exception as exc:  # a node being restarted
            out[node.name] = f"error: {type(exc).__name__}: {exc}"
    return out


class Flow:
    """One stream: a producer sending every ``pause`` seconds and a consumer counting what it got."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.sent = 0
        self.confirmed: list[tuple[float, int]] = []  # (when, message number)
        self.readers: list[Reader] = []

    def on_confirm(self, c: Any, number: int) -> None:
        if c.confirmed:
            self.confirmed.append((time.monotonic(), number))



class Reader:
    """One consumer of a flow's stream: what it received, and when it last did."""

    def __init__(self, flow: Flow, index: int) -> None:
        self.flow, self.index = flow, index
        self.received: set[int] = set()
        self.last_at = time.monotonic()
        self.consumer: Any = None
        self.stalled_at: float | None = None  # reported silent since; cleared (and said) once it receives again

    def on_message(self, message: Any, context: Any) -> None:
        self.received.add(int(bytes(message)))
        self.last_at = time.monotonic()

    def missing_confirmed_before(self, moment: float) -> list[int]:
        return sorted(n for t, n in self.flow.confirmed if t < moment and n not in self.received)


async def publish(env: Any, flow: Flow, pause: float, stop: asyncio.Event) -> None:
    producer = await env.producer(flow.stream, name=f"p-{flow.stream}")
    while not stop.is_set():
        try:
            number = flow.sent
            await producer.send(b"%d" % number, on_confirm=lambda c, n=number: flow.on_confirm(c, n))
            flow.sent += 1
        except Exception as exc:  # recovery runs; count on
            logging.getLogger("rollout").info("%s: send: %s", flow.stream, exc)
        await asyncio.sleep(pause)


async def check(bed: Any, flows: list[Flow], label: str, silent: float, evidence: str) -> int:
    """Look for orphans in every node and for silent consumers; return the stalls found."""
    found = 0
    view = await asyncio.to_thread(orphans, bed)
    bad = {k: v for k, v in view.items() if not re.fullmatch(r"\{\d+,\[\],\[\]\}", v.replace(" ", ""))}
    counts = ", ".join(f"{k.split('@')[0]} {v.split(',')[0].lstrip('{')}" for k, v in view.items())
    print(f"  {label}: consumers per node {counts}; suspicious: {'none' if not bad else ''}", flush=True)
    for node, text in bad.items():
        print(f"    {node}: {text}", flush=True)
    now = time.monotonic()
    for reader in (r for flow in flows for r in flow.readers):
        missing = reader.missing_confirmed_before(now - silent)
        if reader.stalled_at is not None:
            if reader.last_at > reader.stalled_at:
                print(f"  {reader.flow.stream} reader {reader.index} receives again, "
                      f"{reader.last_at - reader.stalled_at:.0f} s after it was reported", flush=True)
                reader.stalled_at = None
            continue
        if missing and now - reader.last_at > silent:
            reader.stalled_at = now
            found += 1
            consumer = reader.consumer
            record = {"at": label, "stream": reader.flow.stream, "reader": reader.index, "missing": len(missing),
                      "first_missing": missing[0], "silent": round(now - reader.last_at, 1),
                      "node": str(consumer.node), "recoveries": consumer.recoveries,
                      "last_offset": consumer.last_offset, "orphans": view,
                      "sockets": node_sockets(str(consumer.node)),
                      "broker": await asyncio.to_thread(broker_view, bed, reader.flow.stream)}
            print("  STALL " + json.dumps(record, default=str, indent=1), flush=True)
            with open(evidence, "a") as out:
                out.write(json.dumps(record, default=str) + "\n")
    return found


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--consumers", type=int, default=2, help="consumers of each stream")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between one producer's messages")
    parser.add_argument("--silent", type=float, default=15.0, help="seconds without a confirmed message: a stall")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after each rollout before the check")
    parser.add_argument("--evidence", default="/tmp/tail_stall_rollout.jsonl")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("smartclient.stream.handles").setLevel(logging.ERROR)
    logging.getLogger("rstream").setLevel(logging.ERROR)
    bed = from_env()
    if isinstance(bed, LocalTestBed):
        bed.up()
    print(f"rollout hunt: RabbitMQ {bed.rabbitmq_version()}, {args.streams} streams, {args.rollouts} rollouts",
          flush=True)
    tag = f"tail-roll-{os.getpid()}"
    flows = [Flow(f"{tag}-{i}") for i in range(args.streams)]
    for i, flow in enumerate(flows):
        await create_stream_led_by(bed, flow.stream, i % len(bed.nodes))
    stop = asyncio.Event()
    stalls = 0
    try:
        async with Environment(all_nodes(bed), recovery=RecoveryPolicy(stall_check=0)) as env:
            for flow in flows:
                for i in range(args.consumers):
                    reader = Reader(flow, i)
                    reader.consumer = await env.consumer(flow.stream, reader.on_message, offset="first")
                    flow.readers.append(reader)
            tasks = [asyncio.create_task(publish(env, flow, args.pause, stop)) for flow in flows]
            await asyncio.sleep(5)
            stalls += await check(bed, flows, "start", args.silent, args.evidence)
            for k in range(args.rollouts):
                began = time.monotonic()
                for i, node in enumerate(bed.nodes):
                    full = (i + k) % 2 == 1  # as the soak: stop_app and full restarts in turn
                    down = await asyncio.to_thread(bed.roll_node, node.name, full)
                    where = " ".join(str(node_index(bed, r.consumer.node) + 1) if r.consumer.node else "-"
                                     for f in flows for r in f.readers)
                    print(f"rollout {k + 1}: {node.name} {'full' if full else 'stop_app'} down {down:.1f} s "
                          f"(consumers' nodes {where})", flush=True)
                    stalls += await check(bed, flows, f"rollout {k + 1} after {node.name}", args.silent,
                                          args.evidence)
                await asyncio.sleep(args.settle)
                stalls += await check(bed, flows, f"rollout {k + 1} settled", args.silent, args.evidence)
                received = sum(len(r.received) for f in flows for r in f.readers)
                print(f"rollout {k + 1} took {time.monotonic() - began:.0f} s; sent {sum(f.sent for f in flows)}, "
                      f"received {received}; stalls so far {stalls}", flush=True)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await asyncio.to_thread(bed.heal)
        await delete_streams(bed, *(f.stream for f in flows))
    print(f"{stalls} stalls in {args.rollouts} rollouts of {len(bed.nodes)} nodes, {args.streams} streams")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
