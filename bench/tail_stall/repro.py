"""Hunt the RabbitMQ 4.0 "tail stall" (issue 32, item 4a): a tracked consumer that recovered onto a replica just
restarted with ``start_app`` is handed every message but the last chunk, and then nothing.

The scenario is ``test_stop_app_then_start_app_producer_and_consumer_progress`` (tests/integration/
test_recovery_faults.py), looped, with the delivery watch off (``RecoveryPolicy(stall_check=0)``) so that a
stall stays visible.  When a run stalls, the evidence is captured before anything else moves:

* the broker's view, per node, by ``rabbitmqctl eval``: every ``rabbit_stream_reader`` consumer of the stream
  (subscription id, credit, send limit, ``last_listener_offset``, its osiris reader's next offset and the
  committed / last chunk id the reader sees, messages consumed); the stream member's state (replica:
  ``committed_chunk_id``, pending offset listeners; writer: committed offset); ``stream_status``;
* the client's view: the smartclient consumer (node, last offset, subscription id, rstream's position, chunks
  queued) and, from in-process hooks on rstream's client (no library code is changed): every Subscribe sent
  (connection, id, offset, credit), every Deliver frame handed to the delivery loop (connection, subscription,
  first offset, records), every Credit sent.

Run (the 4.0 bed, port base 23000, must be up)::

    SMARTCLIENT_TESTBED_RABBITMQ=4.0 .venv/bin/python bench/tail_stall/repro.py --runs 40
    ... --mode tail       # publish only a last batch of --tail messages right after the restart
    ... --mode ci         # (default) the CI test's schedule: steady publishing through both restarts

Each run prints one line; a stall prints the evidence and appends it (JSON) to ``--evidence``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections import defaultdict, deque
from typing import Any

os.environ.setdefault("SMARTCLIENT_TESTBED_RABBITMQ", "4.0")

from rstream.client import Client

from smartclient import Environment, OffsetTracking, RecoveryPolicy
from smartclient.core.address import Address
from smartclient.stream._rstream import placed
from smartclient.testing import from_env
from smartclient.testing.streams import delete_streams, raw_stream_client

log = logging.getLogger("tail_stall")

# -- client-side hooks (in this process only) ---------------------------------------------------------
EVENTS: deque[tuple[Any, ...]] = deque(maxlen=4000)
CREDITS: dict[tuple[int, int], int] = defaultdict(int)
T0 = time.monotonic()


def _now() -> float:
    return round(time.monotonic() - T0, 3)


def install_hooks() -> None:
    orig_credit = Client.credit
    orig_subscribe = Client.subscribe
    orig_unsubscribe = Client.unsubscribe
    orig_deliver = placed.PlacedConsumer._on_deliver

    async def credit(self: Any, subscription_id: int, credit: int) -> None:
        CREDITS[(id(self), subscription_id)] += credit
        await orig_credit(self, subscription_id, credit)

    async def subscribe(self: Any, stream: str, subscription_id: int, offset_spec: Any = None,
                        initial_credit: int = 10, properties: Any = None) -> None:
        EVENTS.append((_now(), "subscribe", id(self), f"{self.host}:{self.port}", subscription_id, stream,
                       str(offset_spec), initial_credit))
        await orig_subscribe(self, stream, subscription_id, offset_spec, initial_credit, properties)
        EVENTS.append((_now(), "subscribed", id(self), subscription_id))

    async def unsubscribe(self: Any, subscription_id: int) -> None:
        EVENTS.append((_now(), "unsubscribe", id(self), subscription_id))
        await orig_unsubscribe(self, subscription_id)

    async def on_deliver(self: Any, frame: Any, subscriber: Any, filter_value: Any) -> None:
        client = subscriber.client
        EVENTS.append((_now(), "deliver", id(client), frame.subscription_id, subscriber.subscription_id,
                       frame.chunk_first_offset, frame.num_records, subscriber.offset,
                       frame.subscription_id in client.smartclient_stopping))
        await orig_deliver(self, frame, subscriber, filter_value)

    Client.credit = credit  # type: ignore[method-assign]
    Client.subscribe = subscribe  # type: ignore[method-assign]
    Client.unsubscribe = unsubscribe  # type: ignore[method-assign]
    placed.PlacedConsumer._on_deliver = on_deliver  # type: ignore[method-assign]


# -- broker-side evidence ---------------------------------------------------------------------------
READERS = r"""
Rs = [P || P <- erlang:processes(),
      case erlang:process_info(P, dictionary) of
          {dictionary, D} -> proplists:get_value('$initial_call', D) =:= {rabbit_stream_reader, init, 1};
          _ -> false end],
lists:flatmap(fun(P) ->
    case catch sys:get_state(P, 3000) of
        {_, SD} when element(1, SD) =:= statem_data ->
            Cs = element(4, element(4, SD)),
            [begin
                 Cfg = element(2, C),
                 L = element(5, C),
                 #{reader => P, sid => Sid, stream => element(5, Cfg), member => element(3, Cfg),
                   credit => element(3, C), send_limit => element(4, C), last_listener_offset => element(6, C),
                   log => case L of undefined -> undefined;
                              _ -> #{next_offset => osiris_log:next_offset(L),
                                     committed => osiris_log:committed_offset(L),
                                     last_chunk_id => osiris_log:last_chunk_id(L)} end,
                   consumed => atomics:get(element(7, Cfg), 1), consumer_offset => atomics:get(element(7, Cfg), 2)}
             end || {Sid, C} <- maps:to_list(Cs), element(5, element(2, C)) =:= <<"STREAM">>];
        _ -> []
    end end, Rs).
"""

MEMBER = r"""
case rabbit_stream_manager:lookup_local_member(<<"/">>, <<"STREAM">>) of
    {ok, P} ->
        S0 = sys:get_state(P, 3000),
        S = case [E || E <- tuple_to_list(S0), is_tuple(E), tuple_size(E) > 0, element(1, E) =:= osiris_writer] of
                [W] -> W;
                _ -> S0
            end,
        case element(1, S) of
            osiris_replica ->
                L = element(4, S),
                #{role => replica, pid => P, committed_chunk_id => element(5, S),
                  offset_listeners => [{Pid, O} || {Pid, O, _} <- element(6, S)],
                  log_committed => osiris_log:committed_offset(L), last_chunk_id => osiris_log:last_chunk_id(L),
                  next_offset => osiris_log:next_offset(L)};
            osiris_writer ->
                L = element(3, S),
                #{role => writer, pid => P, committed_offset => element(10, S),
                  offset_listeners => [{Pid, O} || {Pid, O, _} <- element(9, S)],
                  replica_state => element(5, S),
                  last_chunk_id => osiris_log:last_chunk_id(L), next_offset => osiris_log:next_offset(L)};
            Other -> {other, Other}
        end;
    Err -> Err
end.
"""


def erl(text: str, stream: str) -> str:
    return " ".join(text.replace("STREAM", stream).split())


def broker_view(bed: Any, stream: str) -> dict[str, Any]:
    view: dict[str, Any] = {}
    for node in bed.nodes:
        broker = bed.broker(node.name)
        entry: dict[str, Any] = {}
        for key, text in (("readers", READERS), ("member", MEMBER)):
            try:
                entry[key] = broker.ctl(["eval", erl(text, stream)], timeout=30).strip()
            except Exception as exc:  # a stopped node, a timeout
                entry[key] = f"error: {exc}"
        view[node.name] = entry
    try:
        view["stream_status"] = bed.stream_status(stream)
    except Exception as exc:
        view["stream_status"] = f"error: {exc}"
    return view


def client_view(consumer: Any) -> dict[str, Any]:
    from smartclient.stream import _rstream

    sub = consumer._subscriber
    client = sub.client if sub is not None else None
    return {
        "node": str(consumer.node), "last_offset": consumer.last_offset, "recoveries": consumer.recoveries,
        "subscription_id": consumer.subscription_id,
        "rstream_offset": getattr(sub, "offset", None), "moved": getattr(sub, "smartclient_moved", None),
        "queued_chunks": consumer.queued_chunks, "handing_over": consumer.handing_over,
        "connection": f"{client.host}:{client.port}" if client is not None else None,
        "connection_alive": client.is_connection_alive() if client is not None else None,
        "stopping": sorted(client.smartclient_stopping) if client is not None else None,
        "credits_sent_on_this_subscription": CREDITS.get((id(client), consumer.subscription_id)),
        "position": _rstream.position(sub) if sub is not None else None,
    }


# -- the scenario -----------------------------------------------------------------------------------
def all_nodes(bed: Any) -> list[str]:
    return [bed.stream_uri(n.host, n.stream_port) for n in bed.nodes]


def node_index(bed: Any, address: Any) -> int:
    return [Address(*n.advertised) for n in bed.nodes].index(address)


async def create_stream(bed: Any, stream: str, leader: int, segment_bytes: int | None) -> None:
    node = bed.nodes[leader]
    arguments: dict[str, Any] = {"initial-cluster-size": 3}
    if segment_bytes:
        arguments["stream-max-segment-size-bytes"] = segment_bytes
    async with raw_stream_client(bed, node.host, node.stream_port) as client:
        await client.create_stream(stream, arguments)
        for _ in range(200):
            try:
                _, replicas = await client.query_leader_and_replicas(stream)
                if len(replicas) == 2:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{stream}: no 2 replicas")


class Publisher:
    def __init__(self, producer: Any, batch: int, pause: float = 0.002) -> None:
        self.producer, self.batch, self.pause = producer, batch, pause
        self.sent = 0
        self.confirm_times: list[float] = []
        self.failed: list[Any] = []
        self._stop = False
        self._task: asyncio.Task[None] | None = None

    def _on_confirm(self, c: Any) -> None:
        (self.confirm_times.append(time.monotonic()) if c.confirmed else self.failed.append(c))

    async def _run(self) -> None:
        while not self._stop:
            await self.producer.send(b"%d" % self.sent, on_confirm=self._on_confirm)
            self.sent += 1
            if self.sent % self.batch == 0:
                await asyncio.sleep(self.pause)

    def start(self) -> Publisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def burst(self, count: int) -> None:
        for _ in range(count):
            await self.producer.send(b"%d" % self.sent, on_confirm=self._on_confirm)
            self.sent += 1

    async def confirmed_after(self, moment: float, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while sum(1 for t in self.confirm_times if t > moment) < count:
            if time.monotonic() > deadline:
                raise TimeoutError("no publishing progress after the fault")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)
        await asyncio.wait_for(self.producer.flush(), 60)


class Collector:
    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []
        self.last_at = time.monotonic()

    def __call__(self, message: Any, context: Any) -> None:
        self.items.append((context.offset, int(bytes(message))))
        self.last_at = time.monotonic()

    async def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.items) < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


async def one_run(bed: Any, index: int, args: argparse.Namespace) -> dict[str, Any]:
    stream = f"tail-stall-{os.getpid()}-{index}"
    EVENTS.clear()
    CREDITS.clear()
    await create_stream(bed, stream, 0, args.segment_bytes)
    result: dict[str, Any] = {"run": index, "stream": stream, "mode": args.mode}
    try:
        async with Environment(all_nodes(bed), recovery=RecoveryPolicy(stall_check=0)) as env:
            collector = Collector()
            consumer = await env.consumer(stream, collector, offset="first", name="c",
                                          tracking=OffsetTracking(every=args.track_every))
            producer = await env.producer(stream, name="p")
            publisher = Publisher(producer, args.batch, args.pause)
            result["first_node"] = node_index(bed, consumer.node)
            if args.mode == "ci":
                publisher.start()
                await publisher.confirmed_after(0, count=500)
                for victim in (node_index(bed, consumer.node), 0):
                    stopped_at = time.monotonic()
                    name = bed.nodes[victim].name
                    await asyncio.to_thread(bed.stop_app, name)
                    await publisher.confirmed_after(stopped_at, count=500)
                    seen = len(collector.items)
                    if not await collector.wait_for(seen + 200, 30):
                        result["note"] = "no progress between faults"
                    await asyncio.to_thread(bed.start_app, name)
                await publisher.stop()
            else:  # tail: a quiet stream, one restart of the consumer's node (or of the leader), a last batch
                await publisher.burst(args.before)
                await producer.flush()
                await collector.wait_for(args.before, 30)
                victims = [node_index(bed, consumer.node)] if args.victim == "consumer" else [0]
                if args.victim == "both":
                    victims = [node_index(bed, consumer.node), 0]
                for victim in victims:
                    name = bed.nodes[victim].name
                    await asyncio.to_thread(bed.stop_app, name)
                    await publisher.burst(args.during)
                    await producer.flush()
                    await asyncio.to_thread(bed.broker(name).ctl, ["start_app"])  # no wait_ready: race it
                    if args.tail_delay:
                        await asyncio.sleep(args.tail_delay)
                    await publisher.burst(args.tail)
                    await asyncio.to_thread(bed.broker(name).wait_ready)
                await producer.flush()
            result["sent"] = publisher.sent
            result["failed"] = len(publisher.failed)
            ok = await collector.wait_for(publisher.sent, args.wait)
            result["received"] = len(collector.items)
            result["consumer_node"] = node_index(bed, consumer.node) if consumer.node else None
            result["recoveries"] = consumer.recoveries
            if not ok:
                result["stalled"] = True
                result["silent_for"] = round(time.monotonic() - collector.last_at, 1)
                result["last_items"] = collector.items[-3:]
                result["client"] = client_view(consumer)
                result["broker"] = await asyncio.to_thread(broker_view, bed, stream)
                result["client_events"] = list(EVENTS)[-60:]
                # does a fresh subscription on the same node get the tail?  (broker-side data present?)
                if args.probe:
                    result["probe"] = await probe(bed, stream, consumer, collector)
    finally:
        await asyncio.to_thread(bed.heal)
        await delete_streams(bed, stream)
    return result


async def probe(bed: Any, stream: str, consumer: Any, collector: Collector) -> dict[str, Any]:
    """After a stall: (1) one more credit on the stuck subscription, then (2) a fresh raw subscription on the
    same node from the first missing offset: which one gets the tail?"""
    out: dict[str, Any] = {}
    before = len(collector.items)
    sub = consumer._subscriber
    await sub.client.credit(consumer.subscription_id, 1)
    await asyncio.sleep(3)
    out["after_one_credit"] = len(collector.items) - before
    out["broker_after_credit"] = await asyncio.to_thread(broker_view, bed, stream)
    if len(collector.items) == before:
        await sub.client.credit(consumer.subscription_id, 5)
        await asyncio.sleep(3)
        out["after_six_credits"] = len(collector.items) - before
    return out


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--mode", choices=("ci", "tail"), default="ci")
    parser.add_argument("--victim", choices=("consumer", "leader", "both"), default="consumer")
    parser.add_argument("--batch", type=int, default=50, help="ci: messages between pauses")
    parser.add_argument("--pause", type=float, default=0.002, help="ci: seconds of each pause")
    parser.add_argument("--before", type=int, default=2000)
    parser.add_argument("--during", type=int, default=500)
    parser.add_argument("--tail", type=int, default=32)
    parser.add_argument("--tail-delay", type=float, default=0.0)
    parser.add_argument("--track-every", type=int, default=500)
    parser.add_argument("--segment-bytes", type=int, default=None)
    parser.add_argument("--wait", type=float, default=20.0, help="seconds without the whole stream: a stall")
    parser.add_argument("--verbose", action="store_true", help="keep the recoveries' log lines")
    parser.add_argument("--probe", action="store_true", help="after a stall, give credit and look again")
    parser.add_argument("--evidence", default="/tmp/tail_stall_evidence.jsonl")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if not args.verbose:  # the recoveries' own warnings: one line each, and expected here
        logging.getLogger("smartclient.stream.handles").setLevel(logging.ERROR)
        logging.getLogger("rstream").setLevel(logging.ERROR)
    install_hooks()
    bed = from_env()
    stalls = 0
    for index in range(args.runs):
        started = time.monotonic()
        try:
            result = await one_run(bed, index, args)
        except Exception as exc:
            print(f"run {index}: error {type(exc).__name__}: {exc}", flush=True)
            continue
        took = time.monotonic() - started
        line = (f"run {index}: {result.get('received')}/{result.get('sent')} node {result.get('first_node')}->"
                f"{result.get('consumer_node')} recoveries {result.get('recoveries')} {took:.1f}s")
        if result.get("stalled"):
            stalls += 1
            line += " STALL"
            with open(args.evidence, "a") as out:
                out.write(json.dumps(result, default=str) + "\n")
            print(json.dumps({k: v for k, v in result.items() if k != "client_events"}, default=str, indent=1))
            for event in result["client_events"][-25:]:
                print("   ", event)
        print(line, flush=True)
    print(f"{stalls} stalls in {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
