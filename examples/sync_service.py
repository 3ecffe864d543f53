"""A threaded (not asyncio) service: worker threads publish through one SyncEnvironment.

    python examples/sync_service.py               # against the local test bed's round-robin HAProxy

Eight worker threads share one :class:`SyncEnvironment` (its own event loop runs in the background):
each handles "requests" by publishing an event with ``send_wait``.  A consumer on a replica counts them.
Prints where the producer and consumer landed; exit status 0 when every event arrived once.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from resolvers import LoadBalancer
from smartclient import parse_stream_uri
from smartclient.sync import SyncEnvironment

DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:20052/"  # the test bed's round-robin HAProxy


def main() -> int:
    uri = os.environ.get("SMARTCLIENT_URI", DEFAULT_URI)
    stream = f"sync-service-{uuid.uuid4().hex[:6]}"
    seen: list[bytes] = []
    with SyncEnvironment(uri, resolver=LoadBalancer(parse_stream_uri(uri).address)) as env:
        env.create_stream(stream)
        try:
            producer = env.producer(stream, name="sync-service")
            consumer = env.consumer(stream, lambda message, context: seen.append(bytes(message)), offset="first")

            def handle(request: int) -> bool:  # a request handler in a plain thread
                return producer.send_wait(f"event {request}".encode()).confirmed

            with ThreadPoolExecutor(max_workers=8) as pool:
                confirmed = list(pool.map(handle, range(400)))
            deadline = time.monotonic() + 15
            while len(seen) < 400 and time.monotonic() < deadline:
                time.sleep(0.05)
            for record in env.placements():
                print(record.row())
            consumer.close()
            producer.close()
        finally:
            env.delete_stream(stream)
    ok = all(confirmed) and sorted(seen) == sorted(f"event {i}".encode() for i in range(400))
    print(f"{sum(confirmed)} events confirmed from 8 threads, {len(seen)} consumed; every event exactly once: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
