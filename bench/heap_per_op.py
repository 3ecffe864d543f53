"""heap_per_op: what each wing's operation leaves on the heap, repeated a few hundred times (issue 32).

Each operation (a stream producer or consumer opened and closed, a stream created and deleted, a producer on a
rotated client certificate or on OAuth2 tokens, an AMQP 0.9.1 connection, an RPC call, an MQTT publish, an AMQP
1.0 publish, publisher and topology read) runs ``--ops`` times after a warm-up, against the local test bed; glibc
``malloc``'s bytes in use (``mallinfo2``) are read after a full collection and ``malloc_trim(0)`` at the start,
the middle and the end.  The growth per operation over the second half is the figure: a leak grows it, caches
warmed by the first half do not.

Each runs twice, in two processes side by side: with glibc's per-thread caches off
(``GLIBC_TUNABLES=glibc.malloc.tcache_count=0``), where what is in use is what the program holds, and with them
on (the default, the anchor), where every thread also keeps up to 7 freed chunks of each small size, counted as in
use: they fill over thousands of operations, which reads as slow growth.

Run from the repository root (it brings the test bed up): python bench/heap_per_op.py [--ops N]
Prints, as its last line: ``heap_per_op: worst_bytes_per_op=B target <= 64 PASS`` (or MISS), for the run with
the caches off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

TARGET = 64  # bytes per operation, second half, caches off
CACHES_OFF = "glibc.malloc.tcache_count=0"


def heap() -> int:
    from smartclient.allocator import trim_free_memory
    from smartclient.testing.footprint import heap_in_use

    gc.collect()
    gc.collect()
    trim_free_memory()
    return heap_in_use().get("malloc in use kib", 0) * 1024


async def measure(name: str, op: Callable[[], Awaitable[None]], ops: int, warm: int) -> dict[str, Any]:
    for _ in range(warm):
        await op()
    marks, started = [heap()], time.monotonic()
    for _ in range(2):
        for _ in range(ops // 2):
            await op()
        await asyncio.sleep(0.2)  # closes finishing on other threads
        marks.append(heap())
    half = ops // 2
    row = {"name": name, "ops": ops, "first half B/op": (marks[1] - marks[0]) / half,
           "second half B/op": (marks[2] - marks[1]) / half, "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(row), flush=True)
    return row


async def send_one(env: Any, stream: str) -> None:
    """A producer opened on ``stream``, one message sent and confirmed, the producer closed."""
    handle = await env.producer(stream)
    await handle.send(b"x")
    await handle.flush()
    await handle.close()


async def child(ops: int) -> None:
    from resolvers import LoadBalancer
    from smartclient import ClientCertificate, Environment, TokenCredentials
    from smartclient.amqp.rpc import RpcClient, RpcServer
    from smartclient.testing import from_env

    bed = from_env()
    host, port = bed.lb("stream")
    lb = LoadBalancer(f"{host}:{port}", amqp=bed.lb("amqp")[1], mqtt=bed.lb("mqtt")[1])
    stream, queue = f"heap-per-op-{os.getpid()}", f"heap-per-op-{os.getpid()}-q"
    async with Environment(bed.stream_uri(host, port), resolver=lb, management=bed.management()) as env:
        await env.create_stream(stream, {"initial-cluster-size": 3})
        try:
            await measure("stream producer open, send, close", lambda: send_one(env, stream), ops, 20)

            async def consumer() -> None:
                handle = await env.consumer(stream, lambda message, context: None, offset="last")
                await handle.close()
            await measure("stream consumer open, close", consumer, ops, 20)

            created = itertools.count()

            async def create() -> None:
                name = f"{stream}-{next(created)}"
                await env.create_stream(name)
                await env.delete_stream(name)
            await measure("stream created, deleted", create, ops // 2, 10)

            issued = bed.client_certificate(f"heap-per-op-{os.getpid()}")
            certificate = [ClientCertificate(issued.cert_file, issued.key_file)]
            entries = [f"rabbitmq-stream+tls://{n.host}:{n.stream_tls_port}/" for n in bed.nodes]
            async with Environment(entries, tls=bed.tls_context(), client_certificate=lambda: certificate[0]) as tls:
                opened = itertools.count()

                async def on_certificate() -> None:
                    if next(opened) % 10 == 9:
                        rotated = await asyncio.to_thread(bed.rotate_client_certificate, issued.common_name)
                        certificate[0] = ClientCertificate(rotated.cert_file, rotated.key_file)
                    await send_one(tls, stream)
                await measure("TLS producer on a client certificate (rotated every 10)", on_certificate, ops, 20)

            tokens = TokenCredentials(bed.tokens.provider(f"heap-per-op-{os.getpid()}", lifetime=60), name="IdP")
            async with Environment(bed.stream_uri(host, port), resolver=LoadBalancer(f"{host}:{port}"),
                                   credentials=tokens) as by_token:
                await measure("producer on OAuth2 tokens", lambda: send_one(by_token, stream), ops, 20)

            def amqp_connection() -> None:
                with env.amqp_connection() as connection:
                    connection.channel().close()
            await measure("AMQP 0.9.1 connection open, close", lambda: asyncio.to_thread(amqp_connection), ops, 20)

            placer = env.amqp
            with RpcServer(placer, f"{stream}-rpc", lambda body, properties: b"re:" + body) as server:
                server.start()
                with placer.connect() as placed:
                    client = RpcClient(placed, f"{stream}-rpc", timeout=5.0)
                    await measure("RPC call x20", lambda: asyncio.to_thread(
                        lambda: [client.call(b"ping") for _ in range(20)]), ops, 10)

            fleet = env.mqtt_fleet(3, client_id_prefix=f"heap-per-op-{os.getpid()}")
            await asyncio.to_thread(fleet.start)
            try:
                def publish() -> None:
                    for n in range(20):
                        fleet.publish(n % 3, "heap-per-op", b"x", qos=1).wait_for_publish(timeout=5)
                await measure("MQTT QoS 1 publish x20", lambda: asyncio.to_thread(publish), ops, 10)
            finally:
                await asyncio.to_thread(fleet.close)

            await amqp10(env, queue, ops)
        finally:
            await env.delete_stream(stream)


async def amqp10(env: Any, queue: str, ops: int) -> None:
    import importlib.util

    if importlib.util.find_spec("rabbitmq_amqp_python_client") is None:
        print("SKIPPED: AMQP 1.0 (the [amqp10] extra is not installed)", flush=True)
        return
    placer = env.amqp10
    env.management.put(f"/api/queues/%2F/{queue}", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    try:
        publisher = placer.publisher(queue)
        try:
            await measure("AMQP 1.0 publish x20", lambda: asyncio.to_thread(
                lambda: [publisher.publish(b"x") for _ in range(20)]), ops, 10)
        finally:
            publisher.close()

        def placed_publisher() -> None:
            handle = placer.publisher(queue)
            handle.publish(b"y")
            handle.close()
        await measure("AMQP 1.0 publisher placed, publish, close", lambda: asyncio.to_thread(placed_publisher),
                      ops // 2, 10)
        await measure("AMQP 1.0 topology read", lambda: asyncio.to_thread(placer.queue_topology, queue), ops, 20)
    finally:
        with contextlib.suppress(Exception):
            env.management.delete(f"/api/queues/%2F/{queue}")
        placer.close()


def run_child(ops: int, caches_off: bool) -> list[dict[str, Any]]:
    environ = dict(os.environ)
    environ.pop("GLIBC_TUNABLES", None)
    if caches_off:
        environ["GLIBC_TUNABLES"] = CACHES_OFF
    done = subprocess.run([sys.executable, __file__, "--child", "--ops", str(ops)], env=environ, text=True,
                          stdout=subprocess.PIPE, check=False)
    rows = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
        elif line.strip():
            print(line)
    if done.returncode != 0:
        raise SystemExit(f"heap_per_op: the {'caches-off' if caches_off else 'default'} run failed "
                         f"(exit {done.returncode})")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=400, help="operations per scenario after its warm-up")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.ops))
        return 0
    from smartclient.testing import from_env
    from smartclient.testing.local import LocalTestBed

    bed = from_env()
    if isinstance(bed, LocalTestBed):
        bed.up()
    print(f"heap_per_op: {args.ops} operations per scenario, RabbitMQ {bed.rabbitmq_version()}", flush=True)
    off, on = run_child(args.ops, True), run_child(args.ops, False)
    print(f"\n{'operation':58} {'caches off: B/op':>18} {'default: B/op':>15}")
    for a, b in zip(off, on, strict=True):
        print(f"{a['name']:58} {a['first half B/op']:8.0f} {a['second half B/op']:8.0f}"
              f"  {b['first half B/op']:6.0f} {b['second half B/op']:7.0f}")
    print("(each pair: the first half's growth per operation, then the second half's; the verdict is on the second)")
    worst = max(a["second half B/op"] for a in off)
    print(f"heap_per_op: worst_bytes_per_op={worst:.0f} target <= {TARGET} {'PASS' if worst <= TARGET else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
