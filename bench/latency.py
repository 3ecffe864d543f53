"""bench/latency.py: publish-to-deliver latency at fixed rates, against the machine's floor, in one run.

For each client, and each rate (1k, 10k and 50k msg/s, then "max": as fast as the client takes messages), a fresh
stream (leader on rabbit-1, one replica) gets 100-byte messages whose first 8 bytes are the send time
(``time.perf_counter_ns``, one clock for the whole process), for ``--seconds`` (20) each.  A consumer on the
replica takes each message's delivery time from the same clock; the first second of each phase is left out.
Messages are sent by a pacer that wakes every millisecond and sends what is due, stamping each as it goes.

* **smartclient per message**: ``producer.send(body)`` for each message (default batching: 2 ms linger), and
  ``env.consumer(stream, callback)``;
* **smartclient per chunk**: the same producer, and ``env.consumer(stream, on_chunk=...)`` (every body of a chunk
  is delivered when the chunk is);
* **rstream**: ``Producer.send_batch`` of what is due at each tick (rstream's ``send()`` waits for a 0.5 s timer,
  so its lowest-latency way at a rate is this), and its ``Consumer`` on the replica;
* **raw pair** (the floor): one pre-encoded Publish frame per tick, its timestamps packed in, written to the
  leader's socket; a reader on the replica's socket that decodes only the timestamps and grants a credit per
  chunk (bench/raw_frames.py's connections).

It prints p50, p99 and p99.9 (ms) for each client at each rate, with the rate reached, and ends with the
verdict on smartclient's per-message p99 at 10k msg/s: at most rstream's in the same run, and at most twice the
raw pair's.  ``--stages RATE`` adds a run of smartclient's per-message pair cut in stages (confirm, the broker's
chunk timestamp, the frame read off the socket, the callback): where its latency goes.
Run from the repository root with the test bed up: python bench/latency.py [--seconds S] [--stages 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

from raw_frames import _own_socket

from smartclient import BatchingPolicy, Environment
from smartclient.stream._rstream.frames import DELIVER_DATA, read_frame_raw
from smartclient.testing.local import LocalTestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams, raw_stream_client, stream_members

RATES: tuple[int | None, ...] = (1_000, 10_000, 50_000, None)  # None: as fast as the client takes them
BODY = 100
WARM_UP = 1.0
TICK = 0.001
_STAMP = struct.Struct(">Q")
_SIZE = struct.Struct(">I")
_DELIVER, _CONFIRM = 0x0008, 0x0003
MAX_TICK = 1000  # "max": messages sent per tick, at most (the client's own back-pressure paces it)

LINGER: float | None = None  # --linger: smartclient's producer's BatchingPolicy.linger (default: the library's)
now_ns = time.perf_counter_ns


def body() -> bytes:
    return _STAMP.pack(now_ns()) + bytes(BODY - 8)


class Latencies:
    """Delivery minus send time of each message delivered after the warm-up, in ns."""

    def __init__(self, expected: int) -> None:
        self.values = array("q")
        self.expected = expected
        self.count = 0
        self.after_ns = 0  # sent before this: the warm-up's
        self.done = asyncio.Event()

    def add(self, stamp_ns: int, at_ns: int) -> None:
        self.count += 1
        if stamp_ns >= self.after_ns:
            self.values.append(at_ns - stamp_ns)
        if self.count >= self.expected:
            self.done.set()

    def percentiles(self) -> tuple[float, float, float]:
        ordered = sorted(self.values)
        if not ordered:
            return (float("nan"),) * 3

        def at(q: float) -> float:
            return ordered[min(int(q * len(ordered)), len(ordered) - 1)] / 1e6

        return at(0.5), at(0.99), at(0.999)


async def pace(rate: int | None, seconds: float, emit: Callable[[int], Awaitable[None]]) -> tuple[int, float]:
    """Call ``emit(k)`` every tick with the ``k`` messages due at ``rate`` (or up to :data:`MAX_TICK` at once
    with no rate); returns how many were sent and in how long."""
    began = time.perf_counter()
    sent = 0
    while (elapsed := time.perf_counter() - began) < seconds:
        due = int(elapsed * rate) + 1 - sent if rate else MAX_TICK
        while due > 0:  # (at most MAX_TICK a frame, after a stall of the loop too)
            count = min(due, MAX_TICK)
            await emit(count)
            sent, due = sent + count, due - count
        if rate:
            await asyncio.sleep(TICK)
        else:
            await asyncio.sleep(0)
    return sent, time.perf_counter() - began


# -- the clients: each runs one phase on a fresh stream and returns (sent, seconds) --------------------------
Phase = Callable[[LocalTestBed, str, int | None, float, Latencies], Awaitable[tuple[int, float]]]


async def smartclient_phase(bed: LocalTestBed, stream: str, rate: int | None, seconds: float, got: Latencies,
                            chunks: bool = False) -> tuple[int, float]:
    node = bed.nodes[0]
    async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
        if chunks:
            def on_chunk(chunk: Any) -> None:
                at = now_ns()
                for message in chunk.bodies:
                    got.add(_STAMP.unpack_from(message)[0], at)

            consumer = await env.consumer(stream, on_chunk=on_chunk, offset="first")
        else:
            def on_message(message: Any, context: Any) -> None:
                got.add(_STAMP.unpack_from(message)[0], now_ns())

            consumer = await env.consumer(stream, on_message, offset="first")
        assert consumer.node != (await env.topology(stream)).leader  # on a replica
        producer = await env.producer(stream, batching=None if LINGER is None else BatchingPolicy(linger=LINGER))

        async def emit(count: int) -> None:
            for _ in range(count):
                await producer.send(body())

        return await run_phase(rate, seconds, emit, got, producer.flush)


async def smartclient_chunks_phase(bed: LocalTestBed, stream: str, rate: int | None, seconds: float,
                                   got: Latencies) -> tuple[int, float]:
    return await smartclient_phase(bed, stream, rate, seconds, got, chunks=True)


async def rstream_phase(bed: LocalTestBed, stream: str, rate: int | None, seconds: float,
                        got: Latencies) -> tuple[int, float]:
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    leader, replica = bed.nodes[0], replica_node(bed, stream)

    def on_message(message: Any, context: Any) -> None:
        got.add(_STAMP.unpack_from(message)[0], now_ns())

    async with Consumer(replica.host, replica.stream_port, username=bed.username, password=bed.password) as consumer, \
            Producer(leader.host, leader.stream_port, username=bed.username, password=bed.password) as producer:
        await consumer.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))

        async def emit(count: int) -> None:
            await producer.send_batch(stream, [body() for _ in range(count)])

        return await run_phase(rate, seconds, emit, got, None)


async def raw_phase(bed: LocalTestBed, stream: str, rate: int | None, seconds: float,
                    got: Latencies) -> tuple[int, float]:
    leader, replica = bed.nodes[0], replica_node(bed, stream)
    async with raw_stream_client(bed, leader.host, leader.stream_port, "bench-latency-writer") as writer_client, \
            raw_stream_client(bed, replica.host, replica.stream_port, "bench-latency-reader") as reader_client:
        await writer_client.declare_publisher(stream=stream, reference=None, publisher_id=1)
        await reader_client.subscribe(stream, subscription_id=1, initial_credit=10)  # from the first offset
        confirms_in, out = await _own_socket(writer_client)
        deliveries, credits = await _own_socket(reader_client)
        one_credit = struct.pack(">IHHBH", 7, 0x0009, 1, 1, 1)
        entry = struct.Struct(">QI")
        next_id = 1
        padding = bytes(BODY - 8)

        async def read_deliveries() -> None:
            while True:
                raw = await read_frame_raw(deliveries)
                if (raw[0] << 8 | raw[1]) != _DELIVER:
                    continue
                at = now_ns()
                credits.write(one_credit)
                pos, records = DELIVER_DATA, _SIZE.unpack_from(raw, 9)[0]  # simple entries: size, then the body
                for _ in range(records):
                    got.add(_STAMP.unpack_from(raw, pos + 4)[0], at)
                    pos += 4 + _SIZE.unpack_from(raw, pos)[0]

        async def drain_confirms() -> None:
            while True:
                await read_frame_raw(confirms_in)

        async def emit(count: int) -> None:
            nonlocal next_id
            parts = [struct.pack(">HHBI", 0x0002, 1, 1, count)]
            for _ in range(count):
                parts.append(entry.pack(next_id, BODY) + _STAMP.pack(now_ns()) + padding)
                next_id += 1
            payload = b"".join(parts)
            out.write(_SIZE.pack(len(payload)) + payload)
            await out.drain()

        tasks = [asyncio.ensure_future(read_deliveries()), asyncio.ensure_future(drain_confirms())]
        try:
            return await run_phase(rate, seconds, emit, got, None)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def run_phase(rate: int | None, seconds: float, emit: Callable[[int], Awaitable[None]], got: Latencies,
                    flush: Callable[[], Awaitable[None]] | None) -> tuple[int, float]:
    got.after_ns = now_ns() + int(WARM_UP * 1e9)
    sent, took = await pace(rate, seconds, emit)
    if flush is not None:
        await flush()
    got.expected = sent
    if got.count < sent:
        got.done.clear()
        await asyncio.wait_for(got.done.wait(), 60)
    return sent, took


def replica_node(bed: LocalTestBed, stream: str) -> Any:
    _, replicas = stream_members(bed, stream)
    (replica,) = replicas
    return bed.node_by_advertised(replica.host, replica.port)


# -- where the latency goes (--stages) ---------------------------------------------------------------------
STAGES = ("send -> confirm", "send -> broker's chunk timestamp", "chunk timestamp -> frame read",
          "frame read -> callback", "send -> callback")


async def stages_phase(bed: LocalTestBed, stream: str, rate: int, seconds: float) -> dict[str, Latencies]:
    """smartclient's per-message pair at ``rate``, each message's path cut at four points: its confirm (the
    leader stored it and the replica has it), the broker's timestamp of the chunk it went in (the leader's wall
    clock, in whole milliseconds, mapped onto this process's clock), the time the replica's Deliver frame was
    read off the consumer's socket, and the callback.  Confirms are taken through ``on_confirm``, which costs
    the producer a little: these figures explain the verdict's run, they are not it."""
    from smartclient.stream._rstream import wire

    wall_minus_perf = time.time_ns() - now_ns()  # the broker's timestamps are wall-clock ms
    reads: list[tuple[int, int]] = []  # (chunk's first offset, read at), in order
    decode = wire.decode_hot

    def timed_decode(raw: bytes) -> Any:
        frame = decode(raw)
        if frame is not None and raw[1] == _DELIVER:
            reads.append((frame.chunk_first_offset, now_ns()))
        return frame

    got = {stage: Latencies(expected=1 << 62) for stage in STAGES}
    total = got["send -> callback"]
    chunk = [0, -1, 0]  # index into reads, the chunk's first offset, read at

    def on_message(message: Any, context: Any) -> None:
        at = now_ns()
        sent = _STAMP.unpack_from(message)[0]
        while chunk[0] < len(reads) and reads[chunk[0]][0] <= context.offset:
            chunk[1], chunk[2] = reads[chunk[0]]
            chunk[0] += 1
        stamped = context.timestamp * 1_000_000 - wall_minus_perf
        got["send -> broker's chunk timestamp"].add(sent, stamped)
        if sent >= total.after_ns:
            got["chunk timestamp -> frame read"].values.append(chunk[2] - stamped)
            got["frame read -> callback"].values.append(at - chunk[2])
        total.add(sent, at)

    wire.decode_hot = timed_decode
    node = bed.nodes[0]
    try:
        async with Environment(bed.stream_uri(node.host, node.stream_port)) as env:
            consumer = await env.consumer(stream, on_message, offset="first")
            assert consumer.node != (await env.topology(stream)).leader  # on a replica
            producer = await env.producer(stream)
            confirmed = got["send -> confirm"]

            async def emit(count: int) -> None:
                for _ in range(count):
                    payload = body()
                    sent = _STAMP.unpack_from(payload)[0]
                    await producer.send(payload, on_confirm=lambda _, sent=sent: confirmed.add(sent, now_ns()))

            for stage in STAGES[:2]:
                got[stage].after_ns = now_ns() + int(WARM_UP * 1e9)
            await run_phase(rate, seconds, emit, total, producer.flush)
    finally:
        wire.decode_hot = decode
    return got


async def print_stages(bed: LocalTestBed, rate: int, seconds: float) -> None:
    stream = f"bench-latency-{uuid.uuid4().hex[:8]}"
    await create_stream_led_by(bed, stream, 0, size=2)
    try:
        got = await stages_phase(bed, stream, rate, seconds)
    finally:
        await delete_streams(bed, stream)
    print(f"where smartclient's per-message latency goes at {label(rate)} msg/s (ms; the broker's timestamp is in "
          "whole ms, so the two stages around it are each +-1 ms, their sum exact):")
    for stage in STAGES:
        p50, p99, p999 = got[stage].percentiles()
        print(f"  {stage:<34} p50 {p50:7.2f}  p99 {p99:7.2f}  p99.9 {p999:7.2f}  ({len(got[stage].values)} messages)")


CLIENTS: dict[str, Phase] = {"smartclient per message": smartclient_phase,
                             "smartclient per chunk": smartclient_chunks_phase,
                             "rstream": rstream_phase, "raw pair": raw_phase}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length (default 20)")
    parser.add_argument("--linger", type=float, default=None, help="smartclient's BatchingPolicy.linger (s)")
    parser.add_argument("--rates", default=None, help="comma-separated msg/s, 0 for max (default 1000,10000,50000,0)")
    parser.add_argument("--clients", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--stages", type=int, default=None, metavar="RATE",
                        help="then one more run of smartclient's per-message pair at RATE msg/s, cut in stages")
    args = parser.parse_args()
    global LINGER, RATES, CLIENTS
    LINGER = args.linger
    if args.rates:
        RATES = tuple(int(r) or None for r in args.rates.split(","))
    if args.clients:
        CLIENTS = {name: CLIENTS[name] for name in args.clients.split(",")}
    bed = LocalTestBed.from_env()
    bed.up()
    results: dict[tuple[str, int | None], tuple[float, float, float, float]] = {}
    for rate in RATES:
        for name, phase in CLIENTS.items():
            stream = f"bench-latency-{uuid.uuid4().hex[:8]}"
            await create_stream_led_by(bed, stream, 0, size=2)
            try:
                got = Latencies(expected=1 << 62)
                sent, took = await phase(bed, stream, rate, args.seconds, got)
            finally:
                await delete_streams(bed, stream)
            p50, p99, p999 = got.percentiles()
            results[(name, rate)] = (sent / took, p50, p99, p999)
            print(f"{name:<24} {label(rate):>6}: {sent / took / 1000:7.1f}k msg/s  p50 {p50:7.2f} ms  "
                  f"p99 {p99:7.2f} ms  p99.9 {p999:7.2f} ms  ({len(got.values)} messages)", flush=True)
    print()
    print(f"{'client':<24} " + " ".join(f"{label(rate):>27}" for rate in RATES))
    for name in CLIENTS:
        print(f"{name:<24} " + " ".join(
            "{:>5.1f}k/s {:>5.2f}/{:>6.2f}/{:>6.2f}".format(results[(name, rate)][0] / 1000, *results[(name, rate)][1:])
            for rate in RATES))
    print("(each: msg/s reached, then p50/p99/p99.9 in ms)")
    if args.stages:
        await print_stages(bed, args.stages, args.seconds)
    if not all((name, 10_000) in results for name in ("smartclient per message", "rstream", "raw pair")):
        print("latency: no verdict (it needs the three clients at 10k msg/s)")
        return 0
    ours, theirs, floor = (results[(name, 10_000)][2] for name in ("smartclient per message", "rstream", "raw pair"))
    ok = ours <= theirs and ours <= 2 * floor
    print(f"p99 at 10k msg/s: smartclient {ours:.2f} ms = {ours / theirs:.2f} of rstream's, {ours / floor:.2f} of "
          f"the raw pair's")
    print(f"latency: p99_10k_ms={ours:.2f} target <= rstream {theirs:.2f} and <= 2x raw pair {2 * floor:.2f} "
          f"{'PASS' if ok else 'MISS'}")
    return 0


def label(rate: int | None) -> str:
    return f"{rate // 1000}k" if rate else "max"


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
