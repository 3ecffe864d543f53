"""Streams laid out on purpose: leaders on chosen nodes, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from smartclient._errors import TestBedError
from smartclient.core.address import Address
from smartclient.testing.testbed import TestBed

__all__ = ["create_stream_led_by", "delete_streams", "raw_stream_client", "stream_members"]


@asynccontextmanager
async def raw_stream_client(bed: TestBed, host: str, port: int, name: str = "") -> AsyncIterator[Any]:
    """A plain rstream client, authenticated; ``server_properties`` then holds the node it reached."""
    from smartclient.stream._rstream import new_client

    client = new_client(None, host=host, port=port, tls=None, frame_max=1048576, heartbeat=60, name=name,
                        on_closed=None, max_ids=200, server_hostname=None)
    await client.start()
    try:
        await client.authenticate(vhost="/", username=bed.username, password=bed.password)
        yield client
    finally:
        await client.close()


async def create_stream_led_by(bed: TestBed, stream: str, node_index: int, size: int = 3) -> None:
    """Create ``stream`` through a connection to node ``node_index`` (the leader is client-local) and wait
    until all ``size`` members are up.  Note the stream protocol's argument keys have no ``x-`` prefix."""
    node = bed.nodes[node_index]
    async with raw_stream_client(bed, node.host, node.stream_port) as client:
        await client.create_stream(stream, {"initial-cluster-size": size})
        for _ in range(200):
            try:
                _, replicas = await client.query_leader_and_replicas(stream)
                if len(replicas) == size - 1:
                    return
            except Exception:  # no leader yet
                pass
            await asyncio.sleep(0.05)
    raise TestBedError(f"{stream} did not get {size - 1} replicas within 10s")


async def delete_streams(bed: TestBed, *streams: str) -> None:
    node = bed.nodes[0]
    async with raw_stream_client(bed, node.host, node.stream_port) as client:
        for stream in streams:
            with contextlib.suppress(Exception):  # already gone
                await client.delete_stream(stream)


def stream_members(bed: TestBed, stream: str) -> tuple[Address, set[Address]]:
    """Leader and replicas (advertised addresses) as the management API reports them."""
    with bed.management() as api:
        info = api.queue("/", stream)
    by_name = {n.name: Address(*n.advertised) for n in bed.nodes}
    leader = by_name[info["leader"]]
    return leader, {by_name[m] for m in info["members"]} - {leader}
