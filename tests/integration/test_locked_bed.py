"""The locked bed, with raw clients: tokens from the bed's identity provider and client certificates log in over
stream, AMQP 0.9.1 and MQTT; the SNI frontends land a connection on the node its SNI names, and refuse a name
they do not know."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pika
import pytest
from rstream import exceptions as rstream_errors
from rstream import schema
from rstream.client import Client
from rstream.connection import Connection

from smartclient.testing import TestBed
from smartclient.testing.certificates import ClientCertificate
from smartclient.testing.oauth import TokenAuthority

from ..conftest import wait_until_sync

NAME = "rabbit-2.smartclient.test"


class SniClient(Client):
    """rstream's Client, with the SNI (and the name TLS verifies) set apart from the address it dials."""

    server_hostname: str | None = None

    async def start(self) -> None:
        self._conn = Connection(self.host, self.port, self._ssl_context)
        self._conn._reader, self._conn._writer = await asyncio.wait_for(asyncio.open_connection(
            self.host, self.port, ssl=self._ssl_context, server_hostname=self.server_hostname), 10)
        self.start_task("listener", self._listener())
        self.add_handler(schema.Heartbeat, self._on_heartbeat)
        self.add_handler(schema.Close, self._on_close)


@contextlib.asynccontextmanager
async def stream_login(host: str, port: int, username: str = "", password: str = "", *,
                       tls: ssl.SSLContext | None = None, server_hostname: str | None = None,
                       mechanism: str = "PLAIN") -> AsyncIterator[dict[str, str]]:
    """A logged-in stream connection; yields the Open response (the node's advertised host and port)."""
    client = SniClient(host, port, ssl_context=tls, frame_max=1048576, heartbeat=60,
                       sasl_configuration_mechanism=mechanism)  # type: ignore[arg-type]
    client.server_hostname = server_hostname
    await client.start()
    try:
        yield await asyncio.wait_for(client.authenticate(vhost="/", username=username, password=password), 10)
    finally:
        await client.close()


def amqp_login(port: int, credentials: Any, *, tls: ssl.SSLContext | None = None,
               server_hostname: str = "127.0.0.1", name: str = "") -> pika.BlockingConnection:
    ssl_options = pika.SSLOptions(tls, server_hostname) if tls is not None else None
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=credentials, ssl_options=ssl_options, connection_attempts=1,
        client_properties={"connection_name": name or f"locked-{uuid.uuid4().hex[:8]}"}))


def mqtt_login(port: int, username: str | None = None, password: str | None = None, *,
               tls: ssl.SSLContext | None = None, client_id: str = "") -> tuple[mqtt.Client, Any]:
    """Connect an MQTT 3.1.1 client; return it (looping, to be stopped by the caller) and its CONNACK code."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"locked-{uuid.uuid4().hex[:8]}",
                         protocol=mqtt.MQTTv311)
    if username is not None:
        client.username_pw_set(username, password)
    if tls is not None:
        client.tls_set_context(tls)
    connack: list[Any] = []
    client.on_connect = lambda c, userdata, flags, rc, props: connack.append(rc)
    client.connect("127.0.0.1", port)
    client.loop_start()
    wait_until_sync(lambda: connack, 10, "a CONNACK")
    return client, connack[0]


def node_of_connection(bed: TestBed, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The management API's row of the one connection ``match`` picks (listed after a statistics round)."""
    def listed() -> dict[str, Any] | None:
        with bed.management() as api:
            rows = [row for row in api.connections() if match(row)]
        return rows[0] if rows else None

    row: dict[str, Any] = wait_until_sync(listed, 30, "the management API to list the connection")
    return row


class _SniContext(ssl.SSLContext):
    """A client context that sends (and verifies) ``sni`` whatever name the client dialled: paho dials the name
    it verifies, and the SNI frontend is on 127.0.0.1."""

    sni: str | None = None

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if self.sni is not None:
            kwargs["server_hostname"] = self.sni
        return super().wrap_socket(sock, *args, **kwargs)


def client_tls(bed: TestBed, certificate: ClientCertificate | None = None, sni: str | None = None
               ) -> ssl.SSLContext:
    context = _SniContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(bed.ca_file)
    context.sni = sni
    if certificate is not None:
        context.load_cert_chain(certificate.cert_file, certificate.key_file)
    return context


# -- tokens -----------------------------------------------------------------------------------------------
async def test_a_token_logs_in_over_stream_amqp_mqtt_and_the_management_api(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority) -> None:
    node = rabbitmq_testbed.nodes[1]
    token, expires_at = rabbitmq_tokens.mint("alice", lifetime=60)
    assert expires_at - time.time() == pytest.approx(60, abs=2)
    async with stream_login(node.host, node.stream_port, "alice", token) as opened:
        assert int(opened["advertised_port"]) == node.stream_port
    connection = amqp_login(node.amqp_port, pika.PlainCredentials("", token))
    try:
        connection.channel().queue_declare("", exclusive=True)  # the scopes grant configure on /
    finally:
        connection.close()
    client, code = mqtt_login(node.mqtt_port, "alice", token)
    client.disconnect()
    client.loop_stop()
    assert code == 0
    response = httpx.get(f"{node.management_url}/api/whoami", auth=("alice", token))  # tag: administrator
    assert response.status_code == 200 and response.json()["name"] == "alice"


async def test_a_token_from_an_untrusted_key_or_expired_is_refused(
        rabbitmq_testbed: TestBed, rabbitmq_tokens: TokenAuthority) -> None:
    node = rabbitmq_testbed.nodes[0]
    untrusted, _ = rabbitmq_tokens.mint("mallory", key="untrusted")
    expired, _ = rabbitmq_tokens.mint("alice", lifetime=-5)
    for token in (untrusted, expired):
        with pytest.raises(rstream_errors.AuthenticationFailure):
            async with stream_login(node.host, node.stream_port, "mallory", token):
                pass
        with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="ACCESS_REFUSED"):
            amqp_login(node.amqp_port, pika.PlainCredentials("mallory", token))
        client, code = mqtt_login(node.mqtt_port, "mallory", token)
        client.loop_stop()
        assert code == "Bad user name or password"


# -- client certificates ------------------------------------------------------------------------------------
async def test_a_client_certificate_logs_in_by_external_over_every_tls_listener(
        rabbitmq_testbed: TestBed, rabbitmq_client_certificate: ClientCertificate) -> None:
    bed, node = rabbitmq_testbed, rabbitmq_testbed.nodes[0]
    tls = client_tls(bed, rabbitmq_client_certificate)
    async with stream_login("127.0.0.1", node.stream_tls_port, tls=tls, mechanism="EXTERNAL") as opened:
        assert int(opened["advertised_port"]) == node.stream_tls_port
    name = f"external-{uuid.uuid4().hex[:8]}"
    connection = amqp_login(node.amqp_tls_port, pika.credentials.ExternalCredentials(), tls=tls, name=name)
    try:
        row = node_of_connection(bed, lambda r: (r.get("client_properties") or {}).get("connection_name") == name)
        assert (row["user"], row["auth_mechanism"]) == ("smartclient-client", "EXTERNAL")
    finally:
        connection.close()
    client, code = mqtt_login(node.mqtt_tls_port, tls=tls)  # no user name: the certificate's common name
    try:
        assert code == 0
    finally:
        client.disconnect()
        client.loop_stop()


async def test_a_rotated_certificate_logs_in_and_the_old_one_still_does(rabbitmq_testbed: TestBed) -> None:
    bed, node = rabbitmq_testbed, rabbitmq_testbed.nodes[2]
    old = bed.client_certificate("rotating-client")
    new = bed.rotate_client_certificate("rotating-client")
    assert new.common_name == old.common_name and new.cert_file != old.cert_file
    assert new.cert_file.read_bytes() != old.cert_file.read_bytes()
    assert bed.client_certificate("rotating-client") == new
    for certificate in (old, new):
        connection = amqp_login(node.amqp_tls_port, pika.credentials.ExternalCredentials(),
                                tls=client_tls(bed, certificate))
        connection.close()


async def test_without_a_certificate_external_is_not_offered_and_guest_still_logs_in(rabbitmq_testbed: TestBed
                                                                                      ) -> None:
    bed, node = rabbitmq_testbed, rabbitmq_testbed.nodes[0]
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        amqp_login(node.amqp_tls_port, pika.credentials.ExternalCredentials(), tls=client_tls(bed))
    amqp_login(node.amqp_tls_port, pika.PlainCredentials(bed.username, bed.password), tls=client_tls(bed)).close()


# -- SNI ----------------------------------------------------------------------------------------------------
async def test_the_sni_names_the_node_a_connection_lands_on(rabbitmq_testbed: TestBed,
                                                            rabbitmq_tokens: TokenAuthority) -> None:
    bed = rabbitmq_testbed
    before = {protocol: bed.sni_sessions(protocol) for protocol in ("stream", "amqp", "mqtt")}
    token, _ = rabbitmq_tokens.mint("sni-user", lifetime=60)
    host, port = bed.sni("stream")
    async with stream_login(host, port, "sni-user", token, tls=client_tls(bed), server_hostname=NAME) as opened:
        assert int(opened["advertised_port"]) == bed.node("rabbit-2").stream_tls_port
    name = f"sni-{uuid.uuid4().hex[:8]}"
    host, port = bed.sni("amqp")
    connection = amqp_login(port, pika.PlainCredentials("", token), tls=client_tls(bed), server_hostname=NAME,
                            name=name)
    try:
        row = node_of_connection(bed, lambda r: (r.get("client_properties") or {}).get("connection_name") == name)
        assert row["node"] == "rabbit-2@localhost"
    finally:
        connection.close()
    client_id = f"sni-{uuid.uuid4().hex[:8]}"
    client, code = mqtt_login(bed.sni("mqtt")[1], "sni-user", token, tls=client_tls(bed, sni=NAME),
                              client_id=client_id)
    try:
        assert code == 0
        row = node_of_connection(bed, lambda r: (r.get("client_properties") or {}).get("client_id") == client_id)
        assert row["node"] == "rabbit-2@localhost"
    finally:
        client.disconnect()
        client.loop_stop()
    for protocol in ("stream", "amqp", "mqtt"):  # other tests may use the frontends meanwhile: at least ours
        assert bed.sni_sessions(protocol)["rabbit-2"] >= before[protocol]["rabbit-2"] + 1, protocol


def _tls_handshake(bed: TestBed, protocol: str, name: str) -> bytes:
    """A TLS handshake through the SNI frontend with ``name``; the peer's certificate (DER)."""
    host, port = bed.sni(protocol)
    context = client_tls(bed)
    with socket.create_connection((host, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        certificate = tls.getpeercert(binary_form=True)
        assert certificate is not None
        return certificate


def test_an_unknown_sni_name_is_refused(rabbitmq_testbed: TestBed) -> None:
    before = rabbitmq_testbed.sni_sessions("amqp")
    for name in ("rabbit-9.smartclient.test", "lb.smartclient.test"):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _tls_handshake(rabbitmq_testbed, "amqp", name)
    assert rabbitmq_testbed.sni_sessions("amqp")["frontend"] >= before["frontend"] + 2  # counted, routed nowhere


def test_an_sni_route_goes_down_and_is_misrouted(rabbitmq_faulty_testbed: TestBed) -> None:
    bed = rabbitmq_faulty_testbed
    _tls_handshake(bed, "mqtt", "rabbit-1.smartclient.test")
    bed.sni_route_down("rabbit-1", "mqtt")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _tls_handshake(bed, "mqtt", "rabbit-1.smartclient.test")
    _tls_handshake(bed, "mqtt", "rabbit-3.smartclient.test")  # the other names are still routed
    bed.sni_route_up("rabbit-1", "mqtt")
    _tls_handshake(bed, "mqtt", "rabbit-1.smartclient.test")

    bed.sni_misroute("rabbit-1", "rabbit-3", "stream")
    with pytest.raises(ssl.SSLCertVerificationError, match=r"rabbit-1\.smartclient\.test"):  # rabbit-3 answers
        _tls_handshake(bed, "stream", "rabbit-1.smartclient.test")
    bed.sni_route_restore("rabbit-1", "stream")
    _tls_handshake(bed, "stream", "rabbit-1.smartclient.test")
    bed.sni_misroute("rabbit-2", "rabbit-3", "amqp")  # heal() restores it
    bed.heal()
    _tls_handshake(bed, "amqp", NAME)
