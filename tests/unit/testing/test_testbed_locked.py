"""The locked bed's pure parts: its ports, the rendered broker and HAProxy configs, the token authority and the
client certificates (no broker)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import jwt
import pytest
from cryptography import x509

from smartclient import ConfigurationError, FaultUnavailable
from smartclient.testing.broker import BrokerProcess, render_enabled_plugins, render_rabbitmq_conf
from smartclient.testing.certificates import (
    current_client_certificate,
    ensure_certificates,
    issue_client_certificate,
)
from smartclient.testing.chroot import RabbitChroot
from smartclient.testing.external import ExternalTestBed
from smartclient.testing.layout import PORT_SPAN, RELEASES, Layout
from smartclient.testing.loadbalancer import HAProxy, render_haproxy_config
from smartclient.testing.local import LocalTestBed
from smartclient.testing.oauth import (
    DEFAULT_SCOPES,
    PUBLIC_KEY_FILE,
    SIGNING_KEY_ID,
    TokenAuthority,
    TokenRevoked,
    ensure_signing_key,
)


def test_the_sni_slot_and_the_amqps_listener_fit_in_the_span() -> None:
    layout = Layout()
    assert layout.sni_port("stream_tls") == 22351
    assert (layout.sni_port("amqp_tls"), layout.sni_port("mqtt_tls")) == (22371, 22382)
    assert layout.nodes[1].amqp_tls_port == 20271
    assert layout.sni_port("mqtt_tls") < layout.base + PORT_SPAN <= RELEASES["4.0"].default_base
    assert not layout.overlaps(23000, 23000 + PORT_SPAN - 1)
    with pytest.raises(ConfigurationError, match="no SNI frontend for protocol 'amqp'"):
        layout.sni_port("amqp")


def test_the_broker_config_locks_nothing_out() -> None:
    spec = Layout().nodes[0]
    conf = render_rabbitmq_conf(spec, ["stream.advertised_host = x"], tls_dir=Path("/srv/tls"), ca="abc")
    lines = conf.splitlines()
    assert "# TLS material: CA abc" in lines
    for line in ("listeners.ssl.default = 127.0.0.1:20171",
                 "auth_backends.1 = rabbit_auth_backend_internal", "auth_backends.2 = rabbit_auth_backend_oauth2",
                 "auth_oauth2.resource_server_id = rabbitmq", "auth_oauth2.preferred_username_claims.1 = sub",
                 f"auth_oauth2.signing_keys.{SIGNING_KEY_ID} = /srv/tls/{PUBLIC_KEY_FILE}",
                 f"auth_oauth2.default_key = {SIGNING_KEY_ID}",
                 "auth_mechanisms.1 = PLAIN", "auth_mechanisms.2 = AMQPLAIN", "auth_mechanisms.3 = EXTERNAL",
                 "ssl_cert_login_from = common_name", "ssl_options.verify = verify_peer",
                 "ssl_options.fail_if_no_peer_cert = false", "mqtt.ssl_cert_login = true"):
        assert line in lines
    assert not any("ANONYMOUS" in line for line in lines)
    assert lines[-1] == "stream.advertised_host = x"
    assert "auth_backends" not in render_rabbitmq_conf(spec)  # no TLS material, no locked bed
    assert "rabbitmq_auth_backend_oauth2" in render_enabled_plugins()
    assert "rabbitmq_auth_mechanism_ssl" in render_enabled_plugins()


def test_a_changed_plugin_list_or_ca_makes_the_config_stale(tmp_path: Path) -> None:
    layout = Layout(base=25000, cache_dir=tmp_path)
    broker = BrokerProcess(layout.nodes[0], layout, RabbitChroot(layout.chroot, "forky"))
    broker.write_files()
    assert broker.config_current()
    (broker.host_dir / "enabled_plugins").write_text("[rabbitmq_stream].\n")
    assert not broker.config_current()
    broker.write_files()
    ensure_certificates(layout.run_dir / "tls", layout.nodes)
    assert not broker.config_current()  # a new CA: the node restarts with its new certificate


def test_the_sni_frontends(tmp_path: Path) -> None:
    layout = Layout()
    cfg = render_haproxy_config(layout, layout.nodes, [("stream", "roundrobin")], tmp_path / "admin.sock")
    frontend = cfg[cfg.index("frontend sni_amqp_tls"):cfg.index("\nbackend sni_amqp_tls_rabbit-1")]
    assert "bind 127.0.0.1:22371" in frontend
    assert "tcp-request inspect-delay 5s" in frontend
    assert "tcp-request content accept if { req_ssl_hello_type 1 }" in frontend
    assert "use_backend sni_amqp_tls_rabbit-2 if { req.ssl_sni -i rabbit-2.smartclient.test }" in frontend
    assert "default_backend" not in cfg
    assert "backend sni_amqp_tls_rabbit-2\n    server rabbit-2 127.0.0.1:20271 check" in cfg
    assert "backend sni_stream_tls_rabbit-3\n    server rabbit-3 127.0.0.1:20351 check" in cfg
    if shutil.which("haproxy"):
        (tmp_path / "haproxy.cfg").write_text(cfg)
        checked = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True,
                                 text=True)
        assert checked.returncode == 0, checked.stderr


def test_sni_names_a_protocol_with_or_without_tls(tmp_path: Path) -> None:
    bed = LocalTestBed(Layout(base=25000, cache_dir=tmp_path))
    assert bed.sni("stream") == bed.sni("stream_tls") == ("127.0.0.1", 27351)
    assert bed.sni("mqtt") == ("127.0.0.1", 27382)
    assert bed.node("rabbit-1").port("amqp_tls") == 25171


def test_an_external_bed_has_no_locks() -> None:
    bed = ExternalTestBed.from_config('{"nodes": [{"host": "127.0.0.1"}]}')
    for call in (lambda: bed.tokens, bed.client_certificate, lambda: bed.sni("amqp"), lambda: bed.sni_sessions("mqtt")):
        with pytest.raises(FaultUnavailable, match="external test bed has no"):
            call()
    for call in (bed.rotate_client_certificate, lambda: bed.sni_route_down("rabbit-1"),
                 lambda: bed.sni_misroute("rabbit-1", "rabbit-2")):
        with pytest.raises(FaultUnavailable, match="external test bed cannot"):
            call()


# -- tokens ---------------------------------------------------------------------------------------------------
@pytest.fixture
def authority(tmp_path: Path) -> TokenAuthority:
    return TokenAuthority.from_directory(tmp_path)


def _claims(tmp_path: Path, token: str) -> dict[str, object]:
    claims: dict[str, object] = jwt.decode(token, (tmp_path / PUBLIC_KEY_FILE).read_bytes(), algorithms=["RS256"],
                                           audience="rabbitmq")
    return claims


def test_a_token_is_an_rs256_jwt_for_the_resource_server(tmp_path: Path, authority: TokenAuthority) -> None:
    before = time.time()
    token, expires_at = authority.mint("alice", lifetime=20)
    after = time.time()
    claims = _claims(tmp_path, token)
    assert jwt.get_unverified_header(token)["kid"] == SIGNING_KEY_ID
    assert claims["sub"] == "alice" and claims["aud"] == ["rabbitmq"] and claims["exp"] == expires_at
    assert str(claims["scope"]).split() == list(DEFAULT_SCOPES)
    assert "rabbitmq.tag:administrator" in DEFAULT_SCOPES
    assert before + 20 <= expires_at <= after + 21  # whole seconds, rounded up; bounds taken around the mint
    assert _claims(tmp_path, authority.mint(scopes=["rabbitmq.read:*/*"])[0])["scope"] == "rabbitmq.read:*/*"
    assert ensure_signing_key(tmp_path) == tmp_path / PUBLIC_KEY_FILE  # kept, not made again
    assert TokenAuthority.from_directory(tmp_path).mint()[0] != token


def test_an_untrusted_key_does_not_verify(tmp_path: Path, authority: TokenAuthority) -> None:
    token, _ = authority.mint(key="untrusted")
    assert jwt.get_unverified_header(token)["kid"] != SIGNING_KEY_ID
    with pytest.raises(jwt.InvalidSignatureError):
        _claims(tmp_path, token)
    with pytest.raises(ConfigurationError, match="unknown signing key 'revoked'"):
        authority.mint(key="revoked")


def test_the_token_authority_faults(authority: TokenAuthority) -> None:
    provider = authority.provider("bob", lifetime=30)
    first, second = provider(), provider()
    assert provider.calls == 2 and first[0] != second[0]
    authority.expire_early(2)
    _, expires_at = provider()
    assert expires_at - time.time() <= 3
    authority.revoke("bob")
    with pytest.raises(TokenRevoked, match="bob"):
        provider()
    assert provider.calls == 4
    authority.mint("carol")  # another subject is still served
    authority.restore()
    _, expires_at = provider()
    assert expires_at - time.time() > 25


def test_providers_are_called_from_many_threads(authority: TokenAuthority) -> None:
    provider = authority.provider("threads", lifetime=30)
    threads = [threading.Thread(target=lambda: [provider() for _ in range(5)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert provider.calls == 20


# -- client certificates ---------------------------------------------------------------------------------------
def test_client_certificates_are_issued_and_rotated(tmp_path: Path) -> None:
    layout = Layout(base=25000, cache_dir=tmp_path)
    tls = tmp_path / "tls"
    ensure_certificates(tls, layout.nodes)
    assert (tls / "ca.key").exists()
    assert current_client_certificate(tls, "app-1") is None
    first = issue_client_certificate(tls, "app-1")
    second = issue_client_certificate(tls, "app-1")
    assert current_client_certificate(tls, "app-1") == second
    assert (first.cert_file.name, second.cert_file.name) == ("app-1.1.pem", "app-1.2.pem")
    certificates = [x509.load_pem_x509_certificate(c.cert_file.read_bytes()) for c in (first, second)]
    assert certificates[0].serial_number != certificates[1].serial_number
    for certificate in certificates:
        assert certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "app-1"
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert list(names)  # Erlang refuses a critical extension left empty
    assert first.key_file.read_bytes() != second.key_file.read_bytes()
    assert first.key_file.stat().st_mode & 0o077 == 0
    with pytest.raises(ConfigurationError, match="common name 'a b'"):
        issue_client_certificate(tls, "a b")


def test_server_states_keep_the_lb_listeners_and_the_sni_frontends_apart(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    layout = Layout(cache_dir=tmp_path)
    haproxy = HAProxy(layout, layout.nodes)
    rows = [{"pxname": "stream_roundrobin", "svname": "FRONTEND", "status": "OPEN"},
            {"pxname": "stream_roundrobin", "svname": "rabbit-1", "status": "UP"},
            {"pxname": "sni_amqp_tls", "svname": "FRONTEND", "status": "OPEN", "stot": "7"},
            {"pxname": "sni_amqp_tls_rabbit-2", "svname": "rabbit-2", "status": "MAINT"},
            {"pxname": "sni_amqp_tls_rabbit-2", "svname": "BACKEND", "status": "DOWN", "stot": "3"}]
    monkeypatch.setattr(haproxy, "stats", lambda: rows)
    assert haproxy.server_states() == {"stream_roundrobin": {"rabbit-1": "UP"}}
    assert haproxy.server_states(sni=True) == {"sni_amqp_tls": {"rabbit-2": "MAINT"}}
    assert haproxy.sni_sessions("amqp_tls") == {"frontend": 7, "rabbit-2": 3}
