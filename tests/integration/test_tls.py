"""TLS verifies the name the user meant: the advertised node name behind a remap, the LB's name through
the LB; a certificate that does not match fails closed."""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref
from typing import Any

import pytest

from resolvers import Chain, DnsResolver, LoadBalancer
from smartclient import Address, CertificateRejected, ConnectionOptions, Environment
from smartclient.stream._rstream.wire import LocatorClient, NamedClient
from smartclient.stream.host import Connection
from smartclient.stream.socket_reader import FrameReader
from smartclient.testing import TestBed
from smartclient.testing.streams import create_stream_led_by, delete_streams

from ..conftest import wait_until


def _tls_uri(bed: TestBed, host: str, port: int) -> str:
    return bed.stream_uri(host, port).replace("rabbitmq-stream://", "rabbitmq-stream+tls://")


async def test_remapped_container_names_are_verified_not_the_ip(
    rabbitmq_faulty_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    bed = rabbitmq_faulty_testbed
    await create_stream_led_by(bed, rabbitmq_unique_name, 1)
    bed.advertise_hostnames(True)
    try:
        node = bed.nodes[0]
        dns = DnsResolver([bed.dns_address[0]], port=bed.dns_address[1])
        async with Environment(_tls_uri(bed, node.host, node.stream_tls_port), tls=bed.tls_context(),
                               resolver=dns) as env:
            producer = await env.producer(rabbitmq_unique_name)
            consumer = await env.consumer(rabbitmq_unique_name, lambda m, c: None)
            await producer.send_wait(b"over TLS")
            assert producer.node == Address("rabbit-2.smartclient.test", bed.nodes[1].stream_tls_port)
            placed = [c for c in env.streams.connector.connections if c.node == producer.node]
            assert placed and all(c.dialled.host == "127.0.0.1" for c in placed)
            assert {c.client.server_hostname for c in placed} == {"rabbit-2.smartclient.test"}
            assert consumer.node is not None and consumer.node.host.endswith(".smartclient.test")
    finally:
        await delete_streams(bed, rabbitmq_unique_name)


async def test_through_the_lb_tls_verifies_the_lb_name(rabbitmq_testbed: TestBed, rabbitmq_unique_name: str) -> None:
    await create_stream_led_by(rabbitmq_testbed, rabbitmq_unique_name, 2)
    host, port = rabbitmq_testbed.lb("stream_tls")
    dns = DnsResolver([rabbitmq_testbed.dns_address[0]], port=rabbitmq_testbed.dns_address[1])
    resolver = Chain(LoadBalancer(Address("lb.smartclient.test", port)), dns)
    try:
        async with Environment(_tls_uri(rabbitmq_testbed, "lb.smartclient.test", port),
                               tls=rabbitmq_testbed.tls_context(),
                               resolver=resolver) as env:
            producer = await env.producer(rabbitmq_unique_name)
            assert producer.node == Address("localhost", rabbitmq_testbed.nodes[2].stream_tls_port)
            assert {c.client.server_hostname for c in env.streams.connector.connections} == {"lb.smartclient.test"}
            assert {c.dialled for c in env.streams.connector.connections} == {Address(host, port)}
    finally:
        await delete_streams(rabbitmq_testbed, rabbitmq_unique_name)


async def test_a_certificate_that_does_not_match_fails_closed(rabbitmq_testbed: TestBed) -> None:
    node = rabbitmq_testbed.nodes[0]
    with pytest.raises(CertificateRejected, match="certificate verify failed"):  # typed, and not retried
        async with Environment(_tls_uri(rabbitmq_testbed, node.host, node.stream_tls_port),
                               tls=rabbitmq_testbed.tls_context(),
                               tls_server_name="rabbit-9.smartclient.test"):
            pass


def _alive(refs: list[weakref.ref[Any]]) -> int:
    return sum(ref() is not None for ref in refs)


def _held_by(refs: list[weakref.ref[Any]], depth: int = 6) -> str:
    """For a failure message: what still refers to each live object, as chains of types (a frame by its code's
    name; an instance's ``__dict__`` by its owner), so a rare hold names its holder."""
    out = []
    for ref in refs:
        obj = ref()
        if obj is None:
            continue
        chain, seen = [type(obj).__qualname__], {id(obj), id(refs)}
        while len(chain) < depth:
            holders = [r for r in gc.get_referrers(obj) if id(r) not in seen and not isinstance(r, weakref.ref)]
            seen.update(id(r) for r in holders)
            if not holders:
                break
            obj = holders[0]
            chain.append(f"frame {obj.f_code.co_qualname}" if inspect.isframe(obj) else type(obj).__qualname__
                         + f" (+{len(holders) - 1})" * (len(holders) > 1))
        out.append(" <- ".join(chain))
        del obj
    return "; ".join(out)


#: what an ended stream connection is made of: its client, its Connection, the reader of its socket, asyncio's TLS
#: layer and its transport (asyncio's socket transport, closed, refers to itself: small, and not ours)
CONNECTION_PARTS = (NamedClient, LocatorClient, Connection, FrameReader, asyncio.sslproto.SSLProtocol,
                    asyncio.sslproto._SSLProtocolTransport)


async def test_ended_tls_connections_are_freed_at_once_not_at_the_next_full_collection(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    """Issue 32: each ended connection's socket, client, read area and 256 KiB TLS buffer waited for a full
    collection, in cycles: the reader with asyncio's TLS layer (which keeps its protocol's buffer methods), the
    client with its Connection (each referred to the other, also through the closed handler), and a lost
    connection's client with its own frame handlers.  They were much of the soak's RSS swing.  With the collector
    off, the connections the broker closes and those the Environment closes all go at once."""
    bed = rabbitmq_testbed
    node = bed.nodes[0]
    name = f"freed-{rabbitmq_unique_name}"
    await create_stream_led_by(bed, rabbitmq_unique_name, 0)
    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, asyncio.sslproto.SSLProtocol)}
    gc.disable()
    try:
        async with Environment(_tls_uri(bed, node.host, node.stream_tls_port), tls=bed.tls_context(),
                               connection=ConnectionOptions(name=name)) as env:
            producer = await env.producer(rabbitmq_unique_name)
            got: list[int] = []
            await env.consumer(rabbitmq_unique_name, lambda m, c: got.append(c.offset), offset="first")
            await producer.send_wait(b"before")
            layers = [weakref.ref(o) for o in gc.get_objects()
                      if isinstance(o, asyncio.sslproto.SSLProtocol) and id(o) not in before]
            assert layers

            def listed() -> list[str]:  # the management API lists a connection a statistics round late
                with bed.management() as api:
                    return [c["name"] for c in api.connections()
                            if str((c.get("client_properties") or {}).get("connection_name", "")).startswith(name)]
            names = await wait_until(lambda: len(listed()) >= 2 and listed(), 30, "the connections listed")
            with bed.management() as api:
                for server_name in names:
                    api.close_connection(server_name, reason="test: freed at once")
            await producer.send_wait(b"after")  # recovered on new connections
            await wait_until(lambda: len(got) >= 2, 30, "both messages")
            # nothing of the closed connections is left for the collector: what is freed at once is not in the
            # garbage a full collection finds (one may still be held until it is replaced: a carrier's last client)
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                gc.collect()
                cyclic = sorted({type(o).__qualname__ for o in gc.garbage if isinstance(o, CONNECTION_PARTS)})
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
            assert cyclic == [], f"left in cycles by the connections the broker closed: {cyclic}"
            layers = [weakref.ref(o) for o in gc.get_objects()
                      if isinstance(o, asyncio.sslproto.SSLProtocol) and id(o) not in before]
        # (the closed Environment's own objects still refer to its closed clients until it is collected: one
        # Environment, once; each connection's socket and buffers go with its end)
        await wait_until(lambda: not _alive(layers), 10,
                         lambda: f"the Environment's TLS layers freed with the collector off (still alive: "
                                 f"{_alive(layers)} of {len(layers)}, held by: {_held_by(layers)})")
    finally:
        gc.enable()
        await delete_streams(bed, rabbitmq_unique_name)
