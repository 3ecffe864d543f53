"""Quickstart: 1 producer and 2 consumers on a stream, through a load balancer, each on the right node.

    python examples/quickstart.py                 # against the local test bed's round-robin HAProxy
    SMARTCLIENT_URI=rabbitmq-stream://user:pw@my-lb:5552/ python examples/quickstart.py

The client dials only the load balancer.  It reads the stream's topology,
checks which node each connection reached, keeps those that landed right (and
parks the others for the next placement), then prints a placement table and
checks it: the producer on the leader, the consumers on the replicas.
Exit status 0 when the placement is right.
"""

from __future__ import annotations

import asyncio
import os
import sys

from resolvers import LoadBalancer
from smartclient import Environment, parse_stream_uri

DEFAULT_URI = "rabbitmq-stream://guest:guest@127.0.0.1:20052/"  # the test bed's round-robin HAProxy
STREAM = "smartclient-quickstart"


async def main() -> int:
    uri = os.environ.get("SMARTCLIENT_URI", DEFAULT_URI)
    lb = parse_stream_uri(uri).address
    received: list[bytes] = []

    async def on_message(message: bytes, context: object) -> None:
        received.append(message)

    async with Environment(uri, resolver=LoadBalancer(lb)) as env:
        await env.create_stream(STREAM, {"initial-cluster-size": 3}, exists_ok=True)
        producer = await env.producer(STREAM, name="quickstart-producer")
        consumers = [await env.consumer(STREAM, on_message, offset="next") for _ in range(2)]
        for i in range(10):
            await producer.send_wait(f"hello {i}".encode())
        for _ in range(50):
            if len(received) >= 20:
                break
            await asyncio.sleep(0.1)

        topology = await env.topology(STREAM)
        print(f"stream {STREAM}: leader {topology.leader}, replicas {', '.join(map(str, topology.replicas))}")
        print(f"dialled only the load balancer {lb}; {env.streams.connector.opened} connections opened in all\n")
        print(f"{'ROLE':<9} {'NODE (reported by the connection)':<36} {'DIALLED':<18} CONNECTION")
        rows = [("producer", producer.placement)] + [("consumer", c.placement) for c in consumers]
        for role, record in rows:
            assert record is not None
            print(f"{role:<9} {record.node!s:<36} {record.dialled!s:<18} {record.connection}")

        problems = []
        if producer.node != topology.leader:
            problems.append(f"the producer is on {producer.node}, not on the leader {topology.leader}")
        for consumer in consumers:
            if consumer.node not in topology.replicas:
                problems.append(f"a consumer is on {consumer.node}, not on a replica")
        if len(received) != 20:
            problems.append(f"the consumers received {len(received)} messages, not 20")
        print()
        if problems:
            print("PLACEMENT WRONG: " + "; ".join(problems))
            return 1
        print("placement OK: producer on the leader, consumers on replicas; 10 messages reached both consumers")
        return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
