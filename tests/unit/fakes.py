"""The unit tests' shared fakes: the stand-ins more than one test file uses for what the library talks to (an
rstream client, a consumer handle, a clock, the management API, an MQTT client and its network, a socket that
answers as a broker), and the frames a broker sends, built here byte for byte.  A fake used by one file alone stays
in that file."""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import struct
import threading
import zlib
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from rstream import OffsetType, schema
from rstream.encoding import encode_frame

from smartclient import ConnectionFailed, ManagementError
from smartclient.core.address import Address
from smartclient.core.flow import ConsumerFlow
from smartclient.core.topology import Role
from smartclient.mqtt.placement import MqttOptions
from smartclient.stream._rstream.frames import decode_hot
from smartclient.stream._rstream.placed import PlacedConsumer
from smartclient.stream.publishing import BatchingPolicy, PublishBuffer


# -- an rstream client ---------------------------------------------------------------------------------------------
class FakeClient:
    """What the library uses of an rstream client: alive until closed, ids taken on it, and what a PublishBuffer
    writes through it (the frame max, the handlers it adds, the socket writer: every frame in ``frames``)."""

    closed = False  # (on the class too: a subclass with an __init__ of its own starts alive)

    def __init__(self) -> None:
        self.closed = False
        self._frame_max = 1024 * 1024
        self._handlers: dict[Any, dict[str, Any]] = {}
        self.frames: list[bytes] = []
        transport = SimpleNamespace(get_write_buffer_size=lambda: 0)
        self._conn = SimpleNamespace(_writer=SimpleNamespace(write=self.frames.append, transport=transport))

    def is_connection_alive(self) -> bool:
        return not self.closed

    async def close(self) -> None:
        self.closed = True

    async def inc_available_id(self) -> None:
        pass

    def add_handler(self, frame: Any, handler: Any, name: str) -> None:
        self._handlers.setdefault(frame, {})[name] = handler

    def ids_written(self) -> list[int]:
        """The publishing ids of every message in the Publish frames written, in order."""
        ids = []
        for frame in self.frames:
            count = struct.unpack_from(">I", frame, 9)[0]
            pos = 13
            for _ in range(count):
                pid, size = struct.unpack_from(">QI", frame, pos)
                ids.append(pid)
                pos += 12 + size
        return ids


def publish_buffer(client: FakeClient | None = None, lost: list[str] | None = None, **policy: Any) -> PublishBuffer:
    """A PublishBuffer of publisher 0 on stream ``s`` over ``client`` (a new one by default): batches of 2, a 1 ms
    linger and 10 in flight unless ``policy`` says otherwise; the reasons of what it loses go to ``lost``."""
    batching = BatchingPolicy(**{"batch_size": 2, "linger": 0.001, "max_in_flight": 10, **policy})
    return PublishBuffer(client or FakeClient(), 0, "s", batching, on_lost=(lost.append if lost is not None else None))


def confirm(buffer: PublishBuffer, *ids: int) -> None:
    """The broker confirms ``ids`` of ``buffer``'s publisher."""
    buffer._on_confirm(SimpleNamespace(publisher_id=buffer.publisher_id, publishing_ids=list(ids)))


# -- a consumer handle, a clock, the management API ----------------------------------------------------------------
class FakeConsumer:
    """What the library reads of a consumer handle: the delivery watch and the lag sampler its stream, name, the
    offset it waits for (``waiting_for``) and its state, and a recovery's new subscription (each loss kept in
    ``losses``); the Spark reader where its last chunk ends (``last_offset``), its node, and its close."""

    role = Role.CONSUMER

    def __init__(self, waiting_for: int | None = None, *, stream: str = "s", name: str | None = "c",
                 active: bool | None = None, handing_over: bool = False, node: str = "localhost:5552",
                 last_offset: int | None = None) -> None:
        self.stream, self.name, self.waiting_for, self.active = stream, name, waiting_for, active
        self.handing_over, self.node, self.last_offset = handing_over, node, last_offset
        self.closed, self.failure, self.recovering = False, None, False
        self.losses: list[str] = []
        self._subscriber = object()

    @property
    def control(self) -> FakeConsumer:  # its own HandleControl
        return self

    @property
    def subscriber(self) -> Any:
        return self._subscriber

    def lost(self, reason: str) -> None:
        self.losses.append(reason)
        self._subscriber = object()  # what a recovery does: a new subscription

    async def close(self) -> None:
        self.closed = True


class Clock:
    """A clock that moves only when the test moves it (``clock.now += 5``): called, or as ``monotonic()``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class FakeManagement:
    """The management API for code that must not ask it anything but its listeners: ``overview()`` lists an MQTT
    listener on each of ``mqtt_nodes``; ``get`` answers ``connections`` (the rows of a connections listing) when
    given, and fails the test otherwise."""

    def __init__(self, connections: list[dict[str, Any]] | None = None, mqtt_nodes: tuple[Address, ...] = (),
                 unanswered: bool = False) -> None:
        self.connections, self.mqtt_nodes, self.unanswered = connections, mqtt_nodes, unanswered
        self.asked_within: list[float | None] = []

    def get(self, path: str, within: float | None = None) -> Any:
        """The listing; ``unanswered``: no node answers (a node cut off, as in a partition)."""
        self.asked_within.append(within)
        if self.unanswered:
            raise ManagementError(f"GET {path} failed: no management node could be reached (ReadTimeout)")
        if self.connections is None:
            raise AssertionError(f"not asked here: {path}")
        assert path.startswith("/api/connections?columns=node,connected_at,client_properties.client_id")
        return self.connections

    def overview(self) -> dict[str, Any]:
        return {"listeners": [{"node": f"rabbit@{a.host}", "protocol": "mqtt", "ip_address": "::", "port": 1883}
                              for a in self.mqtt_nodes]}


# -- an MQTT client, and a network a connection is dialled over ----------------------------------------------------
QUICK_RECONNECT = MqttOptions(reconnect_delay=(0.001, 0.001))


class FakeMqttClient:
    """What MqttPlacer.reconnect uses of a PlacedMqttClient; ``network(dialled)`` says which node a connection
    reaches (raising ConnectionFailed when none)."""

    def __init__(self, network: Any, target: Address) -> None:
        self.network, self.target, self.client_id = network, target, "dev-1"
        self.reached: Address | None = None
        self.dials: list[tuple[Address, Address]] = []
        self.listed_at, self.failovers, self.attempts, self.node, self.dialled = 1, 0, 1, "n?", target
        self.home: Address | None = None
        #: the PUBACK watch ended its connection (its node cut off from its peers): a reconnect through a load
        #: balancer learns each landing's node (the checks of these tests); else it keeps the first that answers
        self.lost_cut_off = True
        self.handovers = 0
        self._sc_lock = threading.Lock()  # (what a reconnect holds: the later identification writes under it)
        self.disconnect_asked = False
        self.slept: list[float] = []

    def wait_unless_disconnected(self, seconds: float) -> bool:
        self.slept.append(seconds)  # (no real wait: the placement's back-off, recorded)
        return self.disconnect_asked

    def reconnect_to(self, dialled: Address, server_name: str | None, timeout: float) -> bool:
        self.dials.append((self.target, dialled))
        self.reached = self.network(dialled)
        return False

    def drop_connection(self) -> None:
        self.reached = None

    def is_connected(self) -> bool:
        return self.reached is not None

    def watch_afresh(self) -> None:
        self.watched_afresh = getattr(self, "watched_afresh", 0) + 1

    def username_pw_set(self, username: str | None, password: str | None = None) -> None:
        self.login = (username, password)

    def logged_in_with(self, secret: str | None, expires_at: float | None) -> None:
        self.login_expires_at = expires_at


def direct_network(down: set[Address]) -> Any:
    """A network where each address dialled is the node reached, but those ``down``, which refuse."""
    def reach(dialled: Address) -> Address:
        if dialled in down:
            raise ConnectionFailed(f"{dialled} refused the connection")
        return dialled

    return reach


# -- a listening socket that answers as a broker, and TLS contexts of a CA of its own ------------------------------
@dataclass
class FakeBroker:
    """Accepts connections; reads each CONNECT and answers ``connack`` (nothing if None), over ``tls`` if given."""

    connack: bytes | None = b"\x20\x02\x00\x00"
    tls: ssl.SSLContext | None = None
    received: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(5)
        self.address = Address("127.0.0.1", self.server.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            try:
                if self.tls is not None:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                conn.settimeout(5)
                self.received.append(conn.recv(4096))
                if self.connack is not None:
                    conn.sendall(self.connack)
                while conn.recv(4096):
                    pass
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.server.close()


def tls_contexts(name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for ``name`` only, and a client context trusting its CA."""
    import trustme  # the [testbed] extra, installed in every stage

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    return server_context, client_context


# -- the frames a broker sends, and the one delivery loop over them ------------------------------------------------
def raw_of(frame: Any) -> bytes:
    return encode_frame(frame)[4:]  # without the size prefix, as a reader hands it over


def simple(body: bytes) -> bytes:
    """A simple entry (one message) of a chunk."""
    return struct.pack(">I", len(body)) + body


def sub_batch(bodies: list[bytes], compression: int = 0) -> bytes:
    """A sub-entry batch of a chunk, gzip-compressed when ``compression`` is 1."""
    records = b"".join(simple(b) for b in bodies)
    data = gzip.compress(records) if compression == 1 else records
    return bytes([0x80 | compression << 4]) + struct.pack(">HII", len(bodies), len(records), len(data)) + data


def deliver(entries: list[bytes], records: int, first: int = 100, subscription: int = 1) -> bytes:
    """A Deliver frame of one chunk of ``entries`` holding ``records`` messages, the first at offset ``first``."""
    data = b"".join(entries)
    return raw_of(schema.Deliver(subscription_id=subscription, magic_version=5, chunk_type=0, num_entries=len(entries),
                                 num_records=records, timestamp=1_700_000_000_123, epoch=7, chunk_first_offset=first,
                                 chunk_crc=zlib.crc32(data), data_length=len(data), trailer_length=0, _reserved=0,
                                 data=data))


def delivered(messages: list[bytes], first: int = 100) -> object:
    """A chunk of ``messages`` (simple entries) from ``first``, decoded as the reader decodes it."""
    return decode_hot(deliver([simple(m) for m in messages], records=len(messages), first=first))


class Subscriber(SimpleNamespace):
    pass


def subscriber(callback: Any, offset: int | None = None) -> tuple[Subscriber, list[str]]:
    """A subscription of stream ``s`` handing each message to ``callback`` (every call kept in ``handed``), from
    ``offset`` or the first; and the credits it gives, each named by how many were handed before it."""
    credits: list[str] = []

    async def credit(sid: int, count: int) -> None:
        credits.append(f"credit after {len(handed)}")

    handed: list[Any] = []

    def record(*args: Any) -> Any:
        handed.append(args)
        return callback(*args)

    sub = Subscriber(subscription_id=1, stream="s", reference="name", callback=record,
                     offset_type=OffsetType.OFFSET if offset is not None else OffsetType.FIRST, offset=offset,
                     client=SimpleNamespace(credit=credit, smartclient_stopping=set(), smartclient_handing={},
                                            is_connection_alive=lambda: True))
    sub.handed = handed
    return sub, credits


def carrier(flow: ConsumerFlow | None = None, on_error: Any = None) -> Any:
    """A consumer carrier of stream ``s``, with its ``flow`` and ``on_error`` when given."""
    return SimpleNamespace(_pool=SimpleNamespace(flows={"s": flow} if flow else {},
                                                 on_error={"s": on_error} if on_error else {}),
                           smartclient_around_chunk=None, smartclient_streams={"s"}, smartclient_left={},
                           smartclient_consumed=Counter(), smartclient_chunks=Counter())


def hand_over(consumer: Any, raw: bytes, sub: Subscriber, keep: Any = None) -> None:
    """The delivery loop (PlacedConsumer._on_deliver) over the Deliver frame ``raw``; ``keep``: a filter's test."""
    post = SimpleNamespace(post_filler=lambda: keep) if keep is not None else None
    asyncio.run(PlacedConsumer._on_deliver(consumer, decode_hot(raw), sub, post))  # type: ignore[arg-type]
