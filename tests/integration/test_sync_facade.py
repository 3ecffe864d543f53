"""The sync facade against the test bed: the same names and errors as the async API, safe from threads."""

from __future__ import annotations

import threading

import pytest

from resolvers import LoadBalancer
from smartclient import Address, ConnectionFailed, StreamNotFound
from smartclient.sync import SyncEnvironment
from smartclient.testing import TestBed

from ..conftest import wait_until_sync


def test_producers_and_consumers_without_asyncio_from_many_threads(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    host, port = rabbitmq_testbed.lb("stream")
    got: list[bytes] = []
    with SyncEnvironment(rabbitmq_testbed.stream_uri(host, port), resolver=LoadBalancer(Address(host, port))) as env:
        env.create_stream(rabbitmq_unique_name)
        try:
            producer = env.producer(rabbitmq_unique_name, name="sync-writer")
            consumer = env.consumer(rabbitmq_unique_name, lambda message, context: got.append(bytes(message)),
                                    offset="first")
            assert producer.node == env.topology(rabbitmq_unique_name).leader  # attributes pass through
            assert consumer.node in env.topology(rabbitmq_unique_name).replicas

            confirmed: list[bool] = []

            def write(worker: int) -> None:
                for i in range(50):
                    confirmed.append(producer.send_wait(b"%d-%d" % (worker, i)).confirmed)

            threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert confirmed == [True] * 200
            wait_until_sync(lambda: len(got) >= 200, 15, lambda: f"200 messages ({len(got)} in)")
            assert sorted(got) == sorted(b"%d-%d" % (w, i) for w in range(4) for i in range(50))
            assert env.stream_stats(rabbitmq_unique_name)["first_chunk_id"] == 0
            assert {r.role for r in env.placements()} >= {"producer", "consumer"}
            with pytest.raises(StreamNotFound):  # the same errors as the async API
                env.producer(rabbitmq_unique_name + "-missing")
            assert env.streams.partitions  # the wing's other async methods are there too, blocking
            consumer.close()
            producer.close()
        finally:
            env.delete_stream(rabbitmq_unique_name)
    with pytest.raises(ConnectionFailed, match="closed"):
        env.topology(rabbitmq_unique_name)


def test_a_sync_call_from_a_callback_is_refused_not_deadlocked(
    rabbitmq_testbed: TestBed, rabbitmq_unique_name: str
) -> None:
    node = rabbitmq_testbed.nodes[0]
    errors: list[BaseException] = []
    with SyncEnvironment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        env.create_stream(rabbitmq_unique_name)
        try:
            def callback(message: object, context: object) -> None:
                try:
                    env.topology(rabbitmq_unique_name)
                except RuntimeError as exc:
                    errors.append(exc)

            env.consumer(rabbitmq_unique_name, callback, offset="first")
            env.producer(rabbitmq_unique_name).send_wait(b"x")
            wait_until_sync(lambda: errors, 10, "the callback's call to be refused")
            assert "would wait for itself" in str(errors[0])
        finally:
            env.delete_stream(rabbitmq_unique_name)


def test_super_streams_without_asyncio(rabbitmq_testbed: TestBed, rabbitmq_unique_name: str) -> None:
    node = rabbitmq_testbed.nodes[0]
    got: list[bytes] = []
    with SyncEnvironment(rabbitmq_testbed.stream_uri(node.host, node.stream_port)) as env:
        env.create_super_stream(rabbitmq_unique_name, partitions=3)
        try:
            with env.super_stream_consumer(rabbitmq_unique_name, lambda m, c: got.append(bytes(m)), offset="first"), \
                    env.super_stream_producer(rabbitmq_unique_name, key=lambda body: body.decode()) as producer:
                confirmations = producer.send_batch([b"a", b"b", b"c", b"d"])
                assert [c.confirmed for c in confirmations] == [True] * 4
                producer.send(b"e")
                producer.flush()
                wait_until_sync(lambda: len(got) >= 5, 15, lambda: f"5 messages ({len(got)} in)")
                assert sorted(got) == [b"a", b"b", b"c", b"d", b"e"]
        finally:
            env.delete_super_stream(rabbitmq_unique_name)
