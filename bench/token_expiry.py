"""bench/token_expiry.py: what the broker does when an OAuth2 token expires, per protocol (issue 31).

Each scenario connects to one node of the locked test bed with a token of the bed's identity provider
(``bed.tokens``, ``--lifetime`` s, 15 by default) and watches until ``--grace`` s after the token's expiry:

* stream (rstream): (a) idle: is the connection closed at expiry, when, with which Close code and reason;
  (b) SaslHandshake + SaslAuthenticate (PLAIN ``\\0user\\0newtoken``) again on the open connection halfway,
  and SaslAuthenticate alone: accepted, and does the connection then outlive the first token; (b') the latter
  with a token from a key the broker does not trust;
* AMQP 0.9.1 (pika): (a) idle; (c) ``connection.update-secret`` halfway, with a new token and with an untrusted
  one;
* MQTT (paho, 5 and 3.1.1): (a) idle: DISCONNECT reason code and string (5), or what the socket does (3.1.1);
  (d) in-band renewal: MQTT 5 AUTH (re-authenticate, 0x19) on the open connection, and a CONNECT that names an
  authentication method (a raw MQTT 5 client: paho sends no AUTH);
* every protocol: a token already expired at connect.

A connection still open at the end is asked to do something that needs its rights (create and delete a stream,
declare a queue, publish at QoS 1), to tell "kept open and usable" from "kept open but refused".

What it found (RabbitMQ 4.3.6 and 4.0.5, 2026-11):

* at expiry the broker closes stream (the socket, no Close frame; the log says "Forcing stream connection ...
  closing because token expired"), MQTT 5 (DISCONNECT 0xA0 "Maximum connect time") and MQTT 3.1.1 (the socket)
  within a second on both lines; AMQP 0.9.1 with connection.close 320 "CONNECTION_FORCED - credential expired"
  on 4.3.6, while 4.0.5 keeps the connection open and refuses what it asks (403 ACCESS_REFUSED, "token has
  expired"), channel by channel;
* a stream connection renews with SaslAuthenticate alone (response 1, and it outlives the first token); a
  SaslHandshake after the Open is an unknown command (Close 13 "unknown frame") on both lines; a refused secret
  closes the connection (4.3.6: 3 s after the refusal; 4.0.5: when the first token expires);
* AMQP 0.9.1 renews with update-secret on both lines; a refused secret closes the connection at once (4.3.6: 530
  NOT_ALLOWED; 4.0.5: 541 INTERNAL_ERROR);
* MQTT has no in-band renewal: an AUTH packet is unparseable to the broker (the socket closes at once), and a
  CONNECT naming an authentication method is refused with 0x8C; a client reconnects with a new token.

The scenarios run at once, in threads.  Run from the repository root with the test bed up
(``python -m smartclient.testing up``); for the 4.0 line, ``SMARTCLIENT_TESTBED_RABBITMQ=4.0`` for both::

    python bench/token_expiry.py [--lifetime 15] [--grace 20] [--json results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import paho.mqtt.client as mqtt
import pika
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from rstream import exceptions as rstream_errors
from rstream import schema
from rstream.client import Client

from smartclient.testing import from_env
from smartclient.testing.local import LocalTestBed
from smartclient.testing.testbed import Node

SUBJECT = "expiry-bench"


@dataclass
class Outcome:
    protocol: str
    scenario: str
    result: str  #: what happened, in a few words
    after_expiry: float | None = None  #: seconds from the token's expiry to the close (None: not closed)
    detail: str = ""  #: the broker's exact code and reason


@dataclass(frozen=True)
class Plan:
    bed: LocalTestBed
    node: Node
    lifetime: float
    grace: float

    def token(self, lifetime: float | None = None, key: str | None = None) -> tuple[str, float]:
        return self.bed.tokens.mint(SUBJECT, self.lifetime if lifetime is None else lifetime, key=key)


# -- stream ------------------------------------------------------------------------------------------------
class WatchedClient(Client):
    """rstream's Client, noting when and how the broker closed the connection."""

    closed_at: float | None = None
    close_frame: tuple[int, str] | None = None

    def _on_close(self, close: schema.Close) -> None:
        self.closed_at = self.closed_at or time.time()
        self.close_frame = (close.code, close.reason)
        super()._on_close(close)


async def _stream_connect(plan: Plan, token: str) -> WatchedClient:
    client = WatchedClient("127.0.0.1", plan.node.stream_port, frame_max=1048576, heartbeat=60,
                           connection_name=f"expiry-{uuid.uuid4().hex[:6]}")
    await client.start()
    await client.authenticate(vhost="/", username=SUBJECT, password=token)
    return client


async def _stream_wait(client: WatchedClient, until: float) -> None:
    while time.time() < until and client.is_connection_alive():
        await asyncio.sleep(0.05)
    if not client.is_connection_alive():
        client.closed_at = client.closed_at or time.time()


async def _stream_usable(client: WatchedClient) -> str:
    name = f"expiry-bench-{uuid.uuid4().hex[:6]}"
    try:
        await asyncio.wait_for(client.create_stream(name, {"initial-cluster-size": 1}), 10)
        await asyncio.wait_for(client.delete_stream(name), 10)
        return "usable (created and deleted a stream)"
    except Exception as exc:
        return f"open but refused: {type(exc).__name__} {exc}"


async def _stream_reauth(client: WatchedClient, token: str, handshake: bool) -> str:
    said = []
    if handshake:
        try:
            answer = await asyncio.wait_for(client.sync_request(
                schema.SaslHandshake(correlation_id=client._corr_id_seq.next()),
                resp_schema=schema.SaslHandshakeResponse), 10)
        except Exception as exc:
            return f"SaslHandshake failed: {type(exc).__name__} {exc}"
        said.append(f"SaslHandshake: mechanisms {answer.mechanisms}")
    response = await asyncio.wait_for(client.sync_request(
        schema.SaslAuthenticate(client._corr_id_seq.next(), mechanism="PLAIN",
                                data=b"\0" + SUBJECT.encode() + b"\0" + token.encode()),
        resp_schema=schema.SaslAuthenticateResponse, raise_exception=False), 10)
    code = response.response_code
    said.append(f"SaslAuthenticate: response code {code}"
                f" ({rstream_errors.ServerError.from_code(code).__name__ if code != 1 else 'OK'})")
    return "; ".join(said)


def _stream_outcome(scenario: str, client: WatchedClient, expires_at: float, detail: str, still_open: str
                    ) -> Outcome:
    if client.closed_at is None:
        return Outcome("stream", scenario, still_open, None, detail)
    how = (f"Close code {client.close_frame[0]} reason {client.close_frame[1]!r}" if client.close_frame
           else "the broker closed the socket, with no Close frame")
    return Outcome("stream", scenario, "closed", client.closed_at - expires_at, "; ".join(filter(None, [detail, how])))


def stream_scenario(plan: Plan, scenario: str) -> Outcome:
    async def run() -> Outcome:
        if scenario == "expired at connect":
            token, _ = plan.token(lifetime=-5)
            try:
                client = await _stream_connect(plan, token)
            except rstream_errors.ServerError as exc:
                return Outcome("stream", scenario, "refused",
                               detail=f"SaslAuthenticate response code {type(exc).code} ({type(exc).__name__})")
            await client.close()
            return Outcome("stream", scenario, "accepted")
        token, expires_at = plan.token()
        client = await _stream_connect(plan, token)
        detail = ""
        try:
            if scenario != "idle":
                await _stream_wait(client, expires_at - plan.lifetime / 2)
                new, _ = plan.token(lifetime=120, key="untrusted" if "untrusted" in scenario else None)
                renewed = time.time()
                detail = await _stream_reauth(client, new, handshake="SaslHandshake" in scenario)
            await _stream_wait(client, expires_at + plan.grace)
            if scenario != "idle" and client.closed_at is not None:
                detail += f"; closed {client.closed_at - renewed:.2f} s after the renewal"
            still = await _stream_usable(client) if client.closed_at is None else ""
            return _stream_outcome(scenario, client, expires_at, detail, f"open at +{plan.grace:g} s: {still}")
        finally:
            if client.is_connection_alive():
                await client.close()

    return asyncio.run(run())


# -- AMQP 0.9.1 ----------------------------------------------------------------------------------------------
def _amqp_connect(plan: Plan, token: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", plan.node.amqp_port, credentials=pika.PlainCredentials(SUBJECT, token), heartbeat=60,
        connection_attempts=1, client_properties={"connection_name": f"expiry-{uuid.uuid4().hex[:6]}"}))


def _amqp_wait(connection: pika.BlockingConnection, until: float) -> tuple[float, str] | None:
    """Process events until ``until``; (when, how) if the broker closed the connection meanwhile."""
    while time.time() < until:
        try:
            connection.process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            return time.time(), f"connection.close {exc.reply_code} {exc.reply_text!r}"
        except pika.exceptions.AMQPConnectionError as exc:
            return time.time(), f"{type(exc).__name__} {exc}"
    return None


def _amqp_usable(connection: pika.BlockingConnection) -> str:
    try:
        connection.channel().queue_declare("", exclusive=True)
        return "usable (declared a queue)"
    except pika.exceptions.AMQPError as exc:
        return f"open but refused: {type(exc).__name__} {exc}"


def amqp_scenario(plan: Plan, scenario: str) -> Outcome:
    if scenario == "expired at connect":
        try:
            _amqp_connect(plan, plan.token(lifetime=-5)[0]).close()
        except pika.exceptions.AMQPConnectionError as exc:
            return Outcome("amqp", scenario, "refused", detail=f"{type(exc).__name__} {exc}")
        return Outcome("amqp", scenario, "accepted")
    token, expires_at = plan.token()
    connection = _amqp_connect(plan, token)
    detail = ""
    closed = None
    if scenario != "idle":
        closed = _amqp_wait(connection, expires_at - plan.lifetime / 2)
        new, _ = plan.token(lifetime=120, key="untrusted" if "untrusted" in scenario else None)
        renewed = time.time()
        try:
            connection.update_secret(new, "token refreshed")
            detail = "update-secret answered update-secret-ok"
        except pika.exceptions.ConnectionClosedByBroker as exc:
            closed = time.time(), f"connection.close {exc.reply_code} {exc.reply_text!r}"
            detail = "update-secret refused"
        except pika.exceptions.AMQPError as exc:
            closed = time.time(), f"{type(exc).__name__} {exc}"
            detail = "update-secret failed"
    if closed is None:
        closed = _amqp_wait(connection, expires_at + plan.grace)
    if closed is not None and scenario != "idle":
        detail += f"; closed {closed[0] - renewed:.2f} s after the renewal"
    if closed is None:
        still = _amqp_usable(connection)
        connection.close()
        return Outcome("amqp", scenario, f"open at +{plan.grace:g} s: {still}", None, detail)
    return Outcome("amqp", scenario, "closed", closed[0] - expires_at, "; ".join(filter(None, [detail, closed[1]])))


# -- MQTT ----------------------------------------------------------------------------------------------------
def _paho(plan: Plan, token: str, version: MQTTProtocolVersion) -> tuple[mqtt.Client, dict[str, Any]]:
    seen: dict[str, Any] = {}
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"expiry-{uuid.uuid4().hex[:6]}",
                         protocol=version)
    client.username_pw_set(SUBJECT, token)

    def on_connect(c: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        seen["connack"] = rc

    def on_disconnect(c: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        seen.setdefault("closed_at", time.time())
        reason = getattr(props, "ReasonString", None) if props is not None else None
        seen["how"] = f"reason code {int(rc.value) if hasattr(rc, 'value') else rc} {str(rc)!r}" + (
            f", reason string {reason!r}" if reason else "")

    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    client.reconnect_delay_set(3600, 3600)  # one connection only
    client.connect("127.0.0.1", plan.node.mqtt_port, keepalive=60)
    client.loop_start()
    deadline = time.time() + 10
    while "connack" not in seen and time.time() < deadline:
        time.sleep(0.02)
    return client, seen


def mqtt_scenario(plan: Plan, scenario: str, version: MQTTProtocolVersion) -> Outcome:
    protocol = "mqtt 5" if version == MQTTProtocolVersion.MQTTv5 else "mqtt 3.1.1"
    if scenario == "expired at connect":
        client, seen = _paho(plan, plan.token(lifetime=-5)[0], version)
        client.loop_stop()
        rc = seen.get("connack")
        code = f"{int(rc.value)} {str(rc)!r}" if rc is not None else "none"
        # paho shows a 3.1.1 return code as its MQTT 5 reason code
        if rc is not None and version == MQTTProtocolVersion.MQTTv311:
            code += f" (paho's name for the 3.1.1 return code {({134: 4, 135: 5}).get(int(rc.value), '?')})"
        return Outcome(protocol, scenario, "refused" if rc is not None and rc.is_failure else "accepted",
                       detail=f"CONNACK {code}")
    token, expires_at = plan.token()
    client, seen = _paho(plan, token, version)
    try:
        while time.time() < expires_at + plan.grace and "closed_at" not in seen:
            time.sleep(0.05)
        if "closed_at" in seen:
            how = seen.get("how", "") if version == MQTTProtocolVersion.MQTTv5 else (
                "the broker closed the socket (3.1.1 has no DISCONNECT from the server; paho reports "
                f"{seen.get('how', '')})")
            return Outcome(protocol, scenario, "closed", seen["closed_at"] - expires_at, how)
        info = client.publish("expiry/bench", b"x", qos=1)
        try:
            info.wait_for_publish(10)
            still = "usable (a QoS 1 publish was acknowledged)"
        except (RuntimeError, ValueError) as exc:
            still = f"publish failed: {exc}; {seen.get('how', '')}"
        return Outcome(protocol, scenario, f"open at +{plan.grace:g} s: {still}")
    finally:
        client.disconnect()
        client.loop_stop()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(text: str) -> bytes:
    return struct.pack("!H", len(text.encode())) + text.encode()


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def _read_packet(sock: socket.socket) -> tuple[int, bytes] | None:
    """One MQTT packet (first byte, body), or None when the socket closes."""
    head = sock.recv(1)
    if not head:
        return None
    length, shift = 0, 0
    while True:
        byte = sock.recv(1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return None
        body += chunk
    return head[0], body


def _reason_string(props: bytes) -> str:
    i = 0
    while i < len(props):
        ident = props[i]
        i += 1
        if ident == 0x1F:
            size = struct.unpack("!H", props[i:i + 2])[0]
            return props[i + 2:i + 2 + size].decode()
        break  # only the reason string is looked for
    return ""


def _describe(packet: tuple[int, bytes] | None, what: str) -> str:
    if packet is None:
        return f"{what}: the broker closed the socket"
    kind, body = packet[0] >> 4, packet[1]
    names = {2: "CONNACK", 14: "DISCONNECT", 15: "AUTH"}
    if kind == 2:
        code, rest = body[1], body[2:]
    else:
        code, rest = (body[0] if body else 0), body[1:]
    size = next((i + 1 for i, byte in enumerate(rest) if not byte & 0x80), 0)  # the properties' length
    reason = _reason_string(rest[size:])
    return f"{what}: {names.get(kind, kind)} reason code 0x{code:02X}" + (f" {reason!r}" if reason else "")


def mqtt5_raw(plan: Plan, with_method: bool) -> Outcome:
    """MQTT 5 re-authentication: AUTH (0x19) on an open connection, or a CONNECT naming a method."""
    token, expires_at = plan.token()
    props = (b"\x15" + _utf8("PLAIN")) if with_method else b""
    variable = _utf8("MQTT") + bytes([5, 0xC2]) + struct.pack("!H", 60) + _varint(len(props)) + props
    payload = _utf8(f"expiry-{uuid.uuid4().hex[:6]}") + _utf8(SUBJECT) + _utf8(token)
    with socket.create_connection(("127.0.0.1", plan.node.mqtt_port), timeout=plan.lifetime + plan.grace) as sock:
        sock.sendall(_packet(0x10, variable + payload))
        connack = _read_packet(sock)
        connected = _describe(connack, "CONNECT")
        if with_method or connack is None or connack[1][1] != 0:
            scenario = "CONNECT with authentication method PLAIN" if with_method else "CONNECT"
            return Outcome("mqtt 5", scenario, "refused" if connack is None or connack[1][1] else "accepted",
                           detail=connected)
        time.sleep(max(0.0, expires_at - plan.lifetime / 2 - time.time()))
        new, _ = plan.token(lifetime=120)
        auth_props = b"\x15" + _utf8("PLAIN") + b"\x16" + _utf8(new)
        sent = time.time()
        sock.sendall(_packet(0xF0, bytes([0x19]) + _varint(len(auth_props)) + auth_props))
        answer = _read_packet(sock)
        while answer is not None and answer[0] >> 4 not in (2, 14, 15):  # skip anything else
            answer = _read_packet(sock)
        closed_at = time.time()
        result = "connection closed at once" if answer is None or answer[0] >> 4 == 14 else "answered"
        return Outcome("mqtt 5", "AUTH re-authenticate (0x19) halfway", result, None,
                       f"{_describe(answer, 'AUTH')} {closed_at - sent:.2f} s after it was sent")


# -- the run -------------------------------------------------------------------------------------------------
def scenarios(plan: Plan) -> list[Callable[[], Outcome]]:
    out: list[Callable[[], Outcome]] = []
    for name in ("idle", "SaslHandshake + SaslAuthenticate halfway", "SaslAuthenticate alone halfway",
                 "SaslAuthenticate alone halfway, untrusted key", "expired at connect"):
        out.append(lambda name=name: stream_scenario(plan, name))  # type: ignore[misc]
    for name in ("idle", "update-secret halfway", "update-secret halfway, untrusted key", "expired at connect"):
        out.append(lambda name=name: amqp_scenario(plan, name))  # type: ignore[misc]
    for version in (MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311):
        for name in ("idle", "expired at connect"):
            out.append(lambda name=name, version=version: mqtt_scenario(plan, name, version))  # type: ignore[misc]
    out.append(lambda: mqtt5_raw(plan, with_method=False))
    out.append(lambda: mqtt5_raw(plan, with_method=True))
    return out


def run_one(job: Callable[[], Outcome]) -> Outcome:
    try:
        return job()
    except Exception as exc:  # a scenario that broke says so in the table
        return Outcome("?", "?", f"bench error: {type(exc).__name__} {exc}")


def table(version: str, plan: Plan, outcomes: list[Outcome]) -> str:
    lines = [f"RabbitMQ {version}, tokens of {plan.lifetime:g} s, watched until {plan.grace:g} s after expiry", "",
             "| protocol | scenario | result | closed after expiry | broker's code and reason |",
             "|---|---|---|---|---|"]
    for o in outcomes:
        after = f"{o.after_expiry:+.2f} s" if o.after_expiry is not None else "-"
        lines.append(f"| {o.protocol} | {o.scenario} | {o.result} | {after} | {o.detail} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lifetime", type=float, default=15.0)
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("--json", default=None, help="also write the outcomes here")
    args = parser.parse_args(argv)
    bed = from_env()
    if not isinstance(bed, LocalTestBed):
        print("token_expiry needs the local test bed (its identity provider)", file=sys.stderr)
        return 2
    plan = Plan(bed, bed.nodes[0], args.lifetime, args.grace)
    version = bed.rabbitmq_version()
    jobs = scenarios(plan)
    started = time.monotonic()
    with ThreadPoolExecutor(len(jobs)) as pool:
        outcomes = list(pool.map(run_one, jobs))
    print(table(version, plan, outcomes))
    print(f"\n({time.monotonic() - started:.0f} s; {threading.active_count()} threads left)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rabbitmq": version, "lifetime": args.lifetime, "grace": args.grace,
                       "outcomes": [asdict(o) for o in outcomes]}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
