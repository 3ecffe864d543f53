"""smartclient places rstream's connections through a seam in rstream's private API.

These tests fail loudly when a new rstream moves that seam; pyproject pins rstream>=1.1.1,<1.2.
"""

import inspect

import rstream
from rstream import Consumer, Producer
from rstream.client import Client, ClientPool
from rstream.constants import MAX_ITEM_ALLOWED

from smartclient.core.settings import PoolLimits
from smartclient.stream._rstream import MAX_ITEM_ALLOWED as OURS


def test_client_pool_get_signature() -> None:
    params = list(inspect.signature(ClientPool.get).parameters)
    assert params == ["self", "connection_name", "addr", "connection_closed_handler", "stream",
                      "sasl_configuration_mechanism", "max_clients_by_connections", "locator_request"]
    assert [p for p in inspect.signature(ClientPool.close).parameters] == ["self"]


def test_producer_and_consumer_hold_their_pool_in_pool_attribute() -> None:
    for cls in (Producer, Consumer):
        carrier = cls("127.0.0.1", 1, username="u", password="p")
        assert isinstance(carrier._pool, ClientPool), cls
        source = inspect.getsource(cls._get_or_create_client)
        assert "self._pool.get(" in source and "addr=Addr(" in source and "stream=stream" in source, cls


def test_private_methods_smartclient_calls_exist() -> None:
    for name in ("_get_or_create_publisher",):
        assert callable(getattr(Producer, name)), name
    carrier = Consumer("127.0.0.1", 1, username="u", password="p")
    assert isinstance(carrier._subscribers, dict)  # read on close and for last_offset
    assert "publisher_name" in inspect.signature(Producer._get_or_create_publisher).parameters
    for name in ("subscribe", "unsubscribe"):
        assert callable(getattr(Consumer, name)), name
    for name in ("query_leader_and_replicas", "add_stream", "get_count_available_ids", "add_handler",
                 "is_connection_alive", "server_properties"):
        assert hasattr(Client, name) or name == "server_properties", name


def test_what_the_placed_carriers_override_and_call() -> None:
    """PlacedProducer/PlacedConsumer take publisher and subscription ids per connection: they rely on where
    rstream asks for them, and on the private tables they keep."""
    from rstream.producer import _Publisher
    from rstream.utils import MonotonicSeq, OnClosedErrorInfo

    assert [f for f in _Publisher.__dataclass_fields__] == ["id", "reference", "stream", "sequence", "client"]
    assert callable(MonotonicSeq) and OnClosedErrorInfo("r", ["s"]).streams == ["s"]
    create = inspect.getsource(Consumer._create_subscriber)
    # the consumer's id is asked for right after its client is placed (PlacedConsumer.get_available_id)
    assert create.index("_get_or_create_client(stream)") < create.index("self.get_available_id()")
    assert "async with self._lock" in inspect.getsource(Consumer.subscribe)
    for cls in (Producer, Consumer):
        carrier = cls("127.0.0.1", 1, username="u", password="p")
        for attribute in ("_clients", "_lock", "_connection_name", "_on_connection_closed"):
            assert hasattr(carrier, attribute), (cls, attribute)
    producer = Producer("127.0.0.1", 1, username="u", password="p")
    assert isinstance(producer._publishers, dict) and callable(producer._find_producer_by_stream)
    for name in ("declare_publisher", "delete_publisher", "unsubscribe", "query_offset", "remove_stream",
                 "free_available_id", "inc_available_id", "get_stream_count", "stop_queue_listener_task", "stop_task"):
        assert callable(getattr(Client, name)), name
    client = Client("127.0.0.1", 1, frame_max=1048576, heartbeat=60)
    for attribute in ("_handlers", "_frames", "_tasks", "_conn", "_is_not_closed", "_streams"):
        assert hasattr(client, attribute), attribute


def test_limits_match_rstream() -> None:
    assert OURS == MAX_ITEM_ALLOWED
    assert PoolLimits().max_streams_per_connection <= MAX_ITEM_ALLOWED
    assert rstream.__name__ == "rstream"


# -- generated from the seam's own lists ------------------------------------------------------------------
def _at(dotted: str) -> object:
    import importlib

    obj: object = rstream
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        if not hasattr(obj, part):  # a submodule not imported by rstream's __init__
            obj = importlib.import_module("rstream." + ".".join(parts[: index + 1]))
        else:
            obj = getattr(obj, part)
    return obj


def _instance(cls: type) -> object:
    from rstream.connection import Connection

    if issubclass(cls, Client):
        return cls("127.0.0.1", 1, frame_max=1048576, heartbeat=60)
    if cls is Connection:
        return cls("127.0.0.1", 1, None)
    if issubclass(cls, ClientPool):
        return cls("127.0.0.1", 1, vhost="/", username="u", password="p", frame_max=1048576, heartbeat=60,
                   load_balancer_mode=False, max_retries=1)
    return cls("127.0.0.1", 1, username="u", password="p")


def test_every_rstream_internal_the_seam_lists_exists() -> None:
    from smartclient.stream._rstream import RSTREAM_INTERNALS

    missing = []
    for entry in RSTREAM_INTERNALS:
        owner, _, name = entry.rpartition(".")
        target = _at(owner)
        if isinstance(target, type) and not name[0].isupper():
            present = hasattr(target, name) or hasattr(_instance(target), name)
        else:
            present = hasattr(target, name)
        if not present:
            missing.append(entry)
    assert not missing, f"rstream {rstream.__name__} lacks what the seam relies on: {missing}"


def test_every_rstream_name_the_seam_imports_exists() -> None:
    from smartclient.stream._rstream import RSTREAM_NAMES

    for entry in RSTREAM_NAMES:
        assert _at(entry) is not None, entry


def test_the_lists_cover_every_private_name_the_seam_touches_and_nothing_else_imports_rstream() -> None:
    import re
    from pathlib import Path

    from smartclient.stream._rstream import RSTREAM_INTERNALS

    root = Path(__file__).resolve().parents[3]
    seam = root / "smartclient" / "stream" / "_rstream"
    listed = {entry.rpartition(".")[2] for entry in RSTREAM_INTERNALS}
    ours = {"_rstream", "_pool", "_errors", "_publishers", "_pyarrow"}  # our own modules, or listed elsewhere
    touched = set()
    for path in seam.glob("*.py"):
        touched |= set(re.findall(r"\.(_[a-z][a-z_]*)", path.read_text()))
    assert touched - listed - ours == set(), "private rstream names used by the seam but not listed"
    outside = [str(p.relative_to(root)) for top in ("smartclient", "resolvers") for p in (root / top).rglob("*.py")
               if seam not in p.parents and re.search(r"^\s*(import|from) rstream\b", p.read_text(), re.M)]
    assert outside == [], f"only the seam imports rstream: {outside}"
    generic = {"_lock", "_tasks", "_ssl_context", "_listener", "_on_close", "_on_heartbeat", "_reader", "_writer",
               "_waiters"}  # names our own classes use too
    pattern = re.compile(r"\.(" + "|".join(sorted((listed | {"_pool"}) - generic)) + r")\b")
    other_seams = {"_pika.py", "_paho.py", "_pyspark.py", "_rabbitmq_amqp.py"}  # their own clients' names
    touching = [f"{p.relative_to(root)}: {m.group(0)}" for top in ("smartclient", "resolvers")
                for p in (root / top).rglob("*.py") if seam not in p.parents and p.name not in other_seams
                for m in pattern.finditer(p.read_text())]
    assert touching == [], f"only the seam touches rstream's private names: {touching}"


def test_a_connection_closed_before_the_answer_fails_the_open_at_once_not_at_rstreams_timeout() -> None:
    """What an LB does when the backend it picked has just died: it takes the client's connection, tries the
    dead node, and closes it (HAProxy: after its 3 retries, 3 s).  rstream left the pending PeerProperties to
    its 10 s timeout; the seam fails every pending request as soon as its reader stops."""
    import asyncio
    import time

    import pytest

    from smartclient import ConnectionFailed
    from smartclient.core.deadline import attempt
    from smartclient.stream import _rstream

    async def scenario() -> float:
        async def read_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(64)  # the client's PeerProperties
            await asyncio.sleep(0.2)
            writer.close()

        server = await asyncio.start_server(read_then_close, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = _rstream.new_client(None, host="127.0.0.1", port=port, tls=None, frame_max=1 << 20, heartbeat=60,
                                     name="cut", on_closed=None, max_ids=10, server_hostname=None)
        began = time.monotonic()
        try:
            with attempt(30.0, "opening"), _rstream.map_stream_errors("opening 127.0.0.1"):
                await client.start()
                await client.authenticate(vhost="/", username="u", password="p")
        finally:
            await _rstream.abort(client)
            server.close()
        return time.monotonic() - began

    with pytest.raises(ConnectionFailed, match="closed the connection before answering"):
        asyncio.run(scenario())
