"""smartclient reaches into paho-mqtt in one module, ``smartclient/mqtt/_paho.py``.

These tests are generated from that module's lists (``PAHO_INTERNALS``, ``PAHO_NAMES``, ``PAHO_SIGNATURES``,
``PAHO_OVERRIDES``): every entry is checked against the installed paho, the lists are checked to cover every
private name the seam touches, and the library is grepped for paho imports and private names outside the seam.
They fail loudly when a new paho moves the seam; ``pyproject.toml`` pins paho-mqtt>=2.2,<2.3.

The seam's behaviour (poll loop, re-aiming, TLS naming, the error mapping) is driven against a local socket
that answers as a broker would (CONNECT in, CONNACK out): the integration tests run the real broker.
"""

from __future__ import annotations

import inspect
import re
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from smartclient import Address, AuthenticationFailed, CertificateRejected, ConfigurationError, ConnectionFailed
from smartclient.mqtt import _paho
from smartclient.mqtt._paho import (
    PAHO_INTERNALS,
    PAHO_NAMES,
    PAHO_OVERRIDES,
    PAHO_SIGNATURES,
    NamedContext,
    PahoClient,
)
from tests.unit.fakes import FakeBroker, tls_contexts
from tests.unit.seams import ROOT, imports_of, parameters, private_names_used_in, private_uses, resolve_path

SEAM = ROOT / "smartclient" / "mqtt" / "_paho.py"


# -- the lists, entry by entry -------------------------------------------------------------------------
def plain_client() -> paho.Client:
    return paho.Client(CallbackAPIVersion.VERSION2, client_id="seam-test")


def paho_attribute_names() -> set[str]:
    return set(vars(plain_client())) | {n for k in paho.Client.__mro__ for n in vars(k)}


@pytest.mark.parametrize("entry", PAHO_INTERNALS)
def test_every_private_name_of_paho_the_seam_uses_exists(entry: str) -> None:
    owner, name = entry.split(".")
    cls = getattr(paho, owner)
    if any(name in vars(k) for k in cls.__mro__):
        assert callable(getattr(cls, name)), f"paho.mqtt.client.{entry} is no longer a method"
    else:
        assert name in vars(plain_client()), f"paho.mqtt.client.{entry} is no longer set by Client.__init__"


def test_the_instance_attributes_start_as_the_seam_expects() -> None:
    client = plain_client()
    instance = [e.split(".")[1] for e in PAHO_INTERNALS if e.split(".")[1] in vars(client)]
    expected = {"_sock": None, "_sockpairR": None, "_sockpairW": None, "_host": "", "_port": 1883,
                "_ssl_context": None, "_thread": None, "_client_id": b"seam-test", "_inflight_messages": 0,
                "_out_messages": {}, "_out_message_mutex": "a lock", "_keepalive": 60,
                "_last_bytes_received": "a time", "_msgtime_mutex": "a lock", "_ping_t": 0.0}
    assert sorted(instance) == sorted(expected), "PAHO_INTERNALS changed: say here what each attribute starts as"
    for name, value in expected.items():
        if value == "a lock":
            assert callable(getattr(getattr(client, name), "acquire", None)), name
        elif value == "a time":  # paho's clock (time.monotonic), when the client was made
            assert 0 < getattr(client, name) <= time.monotonic(), name
        else:
            assert getattr(client, name) == value, name


@pytest.mark.parametrize("path", PAHO_NAMES)
def test_every_public_name_the_seam_uses_exists(path: str) -> None:
    assert resolve_path(path) is not None


@pytest.mark.parametrize("entry", sorted(PAHO_SIGNATURES))
def test_every_signature_the_seam_relies_on(entry: str) -> None:
    fn = resolve_path(entry, paho)
    have = parameters(fn)
    wanted = list(PAHO_SIGNATURES[entry])
    if entry in PAHO_OVERRIDES:
        assert have == wanted, f"paho's {entry}{inspect.signature(fn)} changed; PahoClient overrides it"
        assert parameters(resolve_path(entry.split(".", 1)[1], PahoClient)) == wanted
    else:
        assert set(wanted) <= set(have), f"paho's {entry}{inspect.signature(fn)} lost {set(wanted) - set(have)}"


def test_the_lists_name_every_private_paho_name_the_seam_touches() -> None:
    listed = {e.split(".")[1] for e in PAHO_INTERNALS}
    touched = private_names_used_in(SEAM) & paho_attribute_names()
    assert touched <= listed, f"the seam touches paho's {sorted(touched - listed)}: add them to PAHO_INTERNALS"
    assert set(PAHO_OVERRIDES) <= set(PAHO_SIGNATURES)
    for entry in PAHO_OVERRIDES:
        assert entry.split(".")[1] in vars(PahoClient), entry


def test_names_smartclient_adds_to_pahos_client_are_not_pahos() -> None:
    """PahoClient and PlacedMqttClient add attributes to paho's Client: a new paho must not use those names."""
    from smartclient.mqtt.placement import MqttPlacer, PlacedMqttClient

    client = MqttPlacer(entry_points=["x:1883"]).new_client("seam-test")
    ours = set(vars(PahoClient)) | set(vars(PlacedMqttClient)) | set(PahoClient.__annotations__) \
        | set(PlacedMqttClient.__annotations__) | (set(vars(client)) - set(vars(plain_client())))
    ours = {n for n in ours if not n.startswith("__")} - {e.split(".")[1] for e in PAHO_OVERRIDES}
    clash = ours & paho_attribute_names()
    assert not clash, f"paho's Client now has {sorted(clash)}: rename smartclient's"


# -- behaviour the seam relies on, read from paho's source ----------------------------------------------
def test_pahos_loops_run_the_overridden_loop_and_retry_a_reconnect_that_raised_oserror() -> None:
    assert "self._loop(" in inspect.getsource(paho.Client.loop)
    forever = inspect.getsource(paho.Client.loop_forever)
    assert "self._loop(" in forever
    assert re.search(r"self\.reconnect\(\)\s+except OSError:", forever)
    assert "self.loop_forever(" in inspect.getsource(paho.Client._thread_main)


def test_pahos_tls_wraps_with_our_context_and_leaves_the_name_check_to_it() -> None:
    source = inspect.getsource(paho.Client._ssl_wrap_socket)
    assert "self._ssl_context.wrap_socket(" in source and "server_hostname=self._host" in source
    assert "getattr(self._ssl_context, 'check_hostname', False)" in source
    assert re.search(r"addr = \(self\._host, self\._port\)", inspect.getsource(paho.Client._create_socket_connection))


# -- the seam against a local socket that answers as a broker ---------------------------------------------
@pytest.fixture
def connack_broker() -> Iterator[FakeBroker]:
    fake = FakeBroker()
    yield fake
    fake.close()


def new_client(tls: ssl.SSLContext | None = None) -> PahoClient:
    client = PahoClient.create("seam-test", MQTTProtocolVersion.MQTTv311, clean_start=True)
    client.configure("guest", "guest", reconnect_delay=(0.1, 1.0), connect_timeout=2.0, tls=tls)
    client.on_connect = lambda c, userdata, flags, reason, properties: client.record_connack(flags, reason)
    return client


def test_connect_and_connack_through_the_poll_loop(connack_broker: FakeBroker) -> None:
    client = new_client()
    try:
        client.send_connect(connack_broker.address, 30, clean_start=True, properties=None)
        assert client.await_connack(2.0) is False and client.last_connack == (False, 0)
        connect = connack_broker.received[0]
        assert connect[0] == 0x10 and b"seam-test" in connect  # CONNECT, our client id
        assert client.client_id == "seam-test" and client.tls_server_name is None
    finally:
        client.close_quietly()
    assert client.socket() is None


def test_aim_at_moves_the_next_reconnect(connack_broker: FakeBroker) -> None:
    other = FakeBroker()
    client = new_client()
    try:
        client.send_connect(connack_broker.address, 30, clean_start=True, properties=None)
        client.await_connack(2.0)
        client.drop_connection()
        assert client.socket() is None
        client.aim_at(other.address)
        client.last_connack = None
        client.reconnect_now()
        client.await_connack(2.0)
        assert len(other.received) == 1 and len(connack_broker.received) == 1
    finally:
        client.close_quietly()
        other.close()


def test_a_failing_aim_fails_the_reconnect_as_pahos_loop_expects(connack_broker: FakeBroker) -> None:
    class Lost(PahoClient):
        def _before_reconnect(self) -> None:
            raise ConnectionFailed("no node left")

    client = Lost.create("seam-test", MQTTProtocolVersion.MQTTv311, clean_start=True)
    client.aim_at(connack_broker.address)
    with pytest.raises(ConnectionRefusedError, match="no node left"):  # an OSError: paho's loop retries it
        client.reconnect()
    with pytest.raises(ConnectionFailed, match="no node left") as caught:
        client.reconnect_now()
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)


# paho 2 reports an MQTT 3.1.1 CONNACK code as its MQTT 5 reason code (5 -> 135 "Not authorized")
@pytest.mark.parametrize(("code", "reported", "error"), [
    (5, "135: Not authorized", AuthenticationFailed), (4, "134: Bad user name or password", AuthenticationFailed),
    (3, "136: Server unavailable", ConnectionFailed), (2, "133: Client identifier not valid", ConnectionFailed),
])
def test_a_refusing_connack_is_mapped(code: int, reported: str, error: type[Exception]) -> None:
    fake = FakeBroker(connack=bytes([0x20, 0x02, 0x00, code]))
    client = new_client()
    try:
        client.send_connect(fake.address, 30, clean_start=True, properties=None)
        with pytest.raises(error, match=f"refused the client \\(reason code {reported}\\)") as caught:
            client.await_connack(2.0)
        assert error is AuthenticationFailed or not isinstance(caught.value, AuthenticationFailed)
        assert caught.value.__cause__ is not None
    finally:
        client.close_quietly()
        fake.close()


def test_no_connack_refused_connect_and_bad_values_are_mapped() -> None:
    silent = FakeBroker(connack=None)
    client = new_client()
    try:
        client.send_connect(silent.address, 30, clean_start=True, properties=None)
        with pytest.raises(ConnectionFailed, match=r"no CONNACK within 0\.3 s"):
            client.await_connack(0.3)
    finally:
        client.close_quietly()
        silent.close()
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(ConnectionFailed, match="ConnectionRefusedError") as caught:
        new_client().send_connect(Address("127.0.0.1", port), 30, clean_start=True, properties=None)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
    hostless: Any = type("Hostless", (), {"host": "", "port": 1883})()  # Address refuses it before paho can
    with pytest.raises(ConfigurationError, match="paho refused a setting: Invalid host"):
        new_client().send_connect(hostless, 30, clean_start=True, properties=None)


def test_tls_verifies_the_name_given_not_the_address_dialled() -> None:
    server_context, client_context = tls_contexts("node-1.example")
    fake = FakeBroker(tls=server_context)
    try:
        good = new_client(client_context)
        good.send_connect(fake.address, 30, clean_start=True, properties=None, server_name="node-1.example")
        assert good.await_connack(2.0) is False and good.tls_server_name == "node-1.example"
        good.close_quietly()
        bad = new_client(client_context)
        with pytest.raises(CertificateRejected, match=r"not valid for 'node-2\.example'") as caught:
            bad.send_connect(fake.address, 30, clean_start=True, properties=None, server_name="node-2.example")
        assert isinstance(caught.value.__cause__, ssl.SSLCertVerificationError)
        bad.close_quietly()
    finally:
        fake.close()
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    with pytest.raises(ConfigurationError, match="does not turn TLS verification off"):
        NamedContext(insecure)


def test_connack_of_reads_pahos_version2_callback_arguments() -> None:
    from paho.mqtt.client import ConnectFlags
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    assert _paho.connack_of(ConnectFlags(session_present=True), ReasonCode(PacketTypes.CONNACK, identifier=134)) \
        == (True, 134)
    assert _paho.connack_of(ConnectFlags(session_present=False), 0) == (False, 0)


# -- nobody else reaches into paho ------------------------------------------------------------------------
def test_only_the_seam_imports_paho() -> None:
    assert imports_of("paho", SEAM) == []


def test_only_the_seam_touches_pahos_private_names() -> None:
    from smartclient.amqp._pika import PIKA_INTERNALS

    names = {e.split(".")[1] for e in PAHO_INTERNALS}
    shared = names & {e.rsplit(".", 1)[1] for e in PIKA_INTERNALS}  # pika's own of the same name, in pika's seam
    assert [use for use in private_uses(names, SEAM, {"PahoClient"})
            if not (use.startswith("smartclient/amqp/_pika.py:") and any(name in use for name in shared))] == []


def test_a_client_that_gives_up_fails_what_paho_had_unacknowledged(connack_broker: FakeBroker) -> None:
    client = new_client()
    try:
        client.send_connect(connack_broker.address, 30, clean_start=True, properties=None)
        client.await_connack(2.0)
        info = client.publish("t", b"never acknowledged", qos=1)  # the fake broker sends no PUBACK
        assert client.in_flight() == 1 and not info.is_published()
        assert client.fail_held(unsent=True) == 1
        assert client.in_flight() == 0
        with pytest.raises(RuntimeError):
            info.wait_for_publish(timeout=1.0)  # raises at once: the client gave up on it
    finally:
        client.close_quietly()


def test_the_silence_watch_pings_every_quarter_and_gives_up_two_seconds_before_dead_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A PINGREQ every quarter of dead_after, busy or not (a link cut toward the node still lets through what the
    node sent until its window fills), one at a time; the connection lost once nothing came for dead_after - 2 s,
    or a ping went unanswered for a quarter less than that (so a ping sent a quarter after the cut is judged in
    time)."""
    client = PahoClient.create("watched", MQTTProtocolVersion.MQTTv311, clean_start=True)
    client.dead_after = 10.0
    client._keepalive = 60  # the broker's: longer than a quarter of dead_after, so the watch pings on its own
    calls: list[str] = []
    monkeypatch.setattr(client, "is_connected", lambda: True)
    monkeypatch.setattr(client, "_send_pingreq", lambda: calls.append("ping"))
    monkeypatch.setattr(client, "_sock_close", lambda: calls.append("close"))
    monkeypatch.setattr(client, "_do_on_disconnect", lambda **kw: calls.append("lost"))
    monkeypatch.setattr(client, "_last_msg_out", time.monotonic())  # paho's own keepalive: nothing due
    client._last_msg_in = client._last_bytes_received = time.monotonic()  # busy: bytes keep coming
    client._check_keepalive()
    assert calls == ["ping"]
    client._ping_t = time.monotonic()  # (paho's, as _send_pingreq sets it)
    client._check_keepalive()
    assert calls == ["ping"]  # one at a time
    client._ping_t = 0.0  # answered
    client._smartclient_pinged = time.monotonic() - 1.9
    client._check_keepalive()
    assert calls == ["ping"]  # not before a quarter
    client._smartclient_pinged = time.monotonic() - 2.0
    client._check_keepalive()
    assert calls == ["ping", "ping"]
    for unanswered, expected in ((5.9, ["ping", "ping"]), (6.0, ["ping", "ping", "close", "lost"])):
        client._ping_t = time.monotonic() - unanswered
        client._last_bytes_received = time.monotonic()  # still receiving: the node's last frames
        client._check_keepalive()
        assert calls == expected, unanswered
    calls.clear()
    client._ping_t = 0.0
    client._smartclient_pinged = time.monotonic()
    client._last_bytes_received = time.monotonic() - 8.0  # silent: lost whatever the pings
    client._check_keepalive()
    assert calls == ["close", "lost"]


def test_the_silence_watch_starts_afresh_on_the_connection_a_placement_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A placement held paho's loop for 19 s while the management API was asked which node the connection reached:
    the PINGRESP waiting unread in the socket must not make the connection kept look dead at once."""
    client = PahoClient.create("placed", MQTTProtocolVersion.MQTTv311, clean_start=True)
    client.dead_after = 10.0
    client._keepalive = 60
    calls: list[str] = []
    monkeypatch.setattr(client, "is_connected", lambda: True)
    monkeypatch.setattr(client, "_send_pingreq", lambda: calls.append("ping"))
    monkeypatch.setattr(client, "_sock_close", lambda: calls.append("close"))
    monkeypatch.setattr(client, "_do_on_disconnect", lambda **kw: calls.append("lost"))
    monkeypatch.setattr(client, "_last_msg_out", time.monotonic())
    client._ping_t = client._smartclient_pinged = time.monotonic() - 19.2  # pinged after the CONNACK
    client._last_msg_in = client._last_bytes_received = time.monotonic() - 19.2
    client.watch_afresh()
    client._check_keepalive()
    assert calls == []  # neither lost nor pinged again at once: a quarter of dead_after from now



def test_a_publish_the_broker_does_not_acknowledge_for_dead_after_less_two_seconds_loses_the_connection(
        connack_broker: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node cut off from its peers answers pings while its queues take nothing: the PUBACK watch (issue 55)."""
    client = new_client()
    try:
        client.dead_after = 10.0
        client.send_connect(connack_broker.address, 30, clean_start=True, properties=None)
        client.await_connack(2.0)
        calls: list[str] = []
        monkeypatch.setattr(client, "_sock_close", lambda: calls.append("close"))
        monkeypatch.setattr(client, "_do_on_disconnect", lambda **kw: calls.append("lost"))
        assert client.oldest_in_flight(now := time.monotonic()) == now  # nothing in flight
        client.publish("t", b"never acknowledged", qos=1)  # the fake broker sends no PUBACK
        (message,) = client._out_messages.values()
        for waited, expected in ((1.0, []), (7.9, []), (8.0, ["close", "lost"])):
            client._last_bytes_received = time.monotonic()  # the broker answers (pings)
            message.timestamp = time.monotonic() - waited
            client._check_keepalive()
            assert calls == expected, waited
        calls.clear()
        message.state = paho.mqtt_ms_queued  # not sent yet (over the in-flight window): not waited for
        client._check_keepalive()
        assert calls == []
    finally:
        client.close_quietly()
