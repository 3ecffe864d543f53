"""smartclient reaches into the official AMQP 1.0 client in one module, ``smartclient/amqp10/_rabbitmq_amqp.py``.

Every private name it lists (``AMQP10_INTERNALS``) is checked against the installed client, the list against what
the seam touches, and the library is grepped for imports of the client (or proton) outside the seam.  The error
mapping is checked against a closed local port; the consumer's node choice is checked with no broker.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rabbitmq_amqp_python_client", reason="the [amqp10] extra is not installed")

from smartclient import Address, ConfigurationError, ConnectionFailed, NoCandidateNode  # noqa: E402
from smartclient.amqp10._rabbitmq_amqp import AMQP10_INTERNALS, QueueTopology, open_connection  # noqa: E402
from smartclient.amqp10.placement import Amqp10Placer  # noqa: E402
from smartclient.credentials import Login  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SEAM = ROOT / "smartclient" / "amqp10" / "_rabbitmq_amqp.py"


def test_every_internal_the_seam_lists_exists_in_the_installed_client() -> None:
    import importlib

    missing = []
    for entry in AMQP10_INTERNALS:
        module_path, owner, name = entry.rsplit(".", 2)
        module = importlib.import_module(f"rabbitmq_amqp_python_client.{module_path}")
        cls = getattr(module, owner, None)
        if cls is None:
            missing.append(entry)
            continue
        # methods, and attributes the class's own methods set (``self._conn = ...`` in dial, say)
        names = set(dir(cls)) | {n for attr in vars(cls).values() for n in getattr(getattr(attr, "__code__", None),
                                                                                 "co_names", ())}
        if name not in names:
            missing.append(entry)
    assert missing == []


def test_the_list_covers_every_private_name_the_seam_touches_and_nothing_else_imports_the_client() -> None:
    listed = {entry.rpartition(".")[2] for entry in AMQP10_INTERNALS}
    touched = set(re.findall(r"\.(_[a-z][a-z_0-9]*)\b", SEAM.read_text()))
    assert touched - listed - {"_errors"} == set()  # smartclient._errors: ours
    outside = [str(p.relative_to(ROOT)) for top in ("smartclient", "resolvers") for p in (ROOT / top).rglob("*.py")
               if p != SEAM and re.search(r"^\s*(import|from) (rabbitmq_amqp_python_client|proton)\b",
                                          p.read_text(), re.M)]
    assert outside == []


def test_a_closed_port_is_a_connection_failure_and_a_certificate_login_is_refused_before_dialling() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(ConnectionFailed, match=f"connecting to 127.0.0.1:{port}"):
            open_connection(Address("127.0.0.1", port), login=Login("PLAIN", "u", "p"), vhost="/", name="n",
                            timeout=5)
    with pytest.raises(ConfigurationError, match="EXTERNAL logs in as the client certificate: it needs TLS"):
        open_connection(Address("127.0.0.1", port), login=Login("EXTERNAL", "", ""), vhost="/", name="n", timeout=5)


def test_a_consumer_goes_where_its_preference_says_spread_over_the_members() -> None:
    placer = Amqp10Placer(None)
    topology = QueueTopology("q", "quorum", "b@h", ("a@h", "b@h", "c@h"))
    assert placer.consumer_node(topology, "leader") == "b@h"
    assert placer.consumer_node(topology, "replica") in {"a@h", "c@h"}
    assert placer.consumer_node(topology, "member") == "a@h"  # none used yet: the first
    assert placer.consumer_node(QueueTopology("q", "quorum", "b@h", ("b@h",)), "replica") == "b@h"  # only the leader
    with pytest.raises(NoCandidateNode, match="no member"):
        placer.consumer_node(QueueTopology("q", "quorum", None, ()), "member")


def test_a_connection_aborted_before_the_sasl_header_is_a_connection_failure_not_a_refused_login() -> None:
    """Through the LB, a node going away aborts a connection before SASL: retried, never taken for bad
    credentials (which are never retried); the broker's unauthorized-access condition is."""
    from rabbitmq_amqp_python_client.qpid.proton import ConnectionException

    from smartclient import AuthenticationFailed
    from smartclient.amqp10._rabbitmq_amqp import amqp10_errors

    aborted = ConnectionException("disconnected: Condition('amqp:connection:framing-error', 'Expected SASL protocol "
                                  "header: no protocol header found (connection aborted)')")
    with pytest.raises(ConnectionFailed) as caught, amqp10_errors("connecting"):
        raise aborted
    assert not isinstance(caught.value, AuthenticationFailed)
    with pytest.raises(AuthenticationFailed), amqp10_errors("connecting"):
        raise ConnectionException("Condition('amqp:unauthorized-access', 'Authentication failed [mech=PLAIN]')")


def test_no_password_in_the_errors_nor_in_what_the_client_logs(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from rabbitmq_amqp_python_client.qpid.proton import ConnectionException

    from smartclient.amqp10._rabbitmq_amqp import amqp10_errors

    with pytest.raises(ConnectionFailed) as caught, amqp10_errors("connecting"):
        raise ConnectionException("Connection amqp://guest:s3cret@127.0.0.1:5672 disconnected")
    assert "s3cret" not in str(caught.value) and "s3cret" not in str(caught.value.__cause__)
    assert "amqp://guest:***@127.0.0.1:5672" in str(caught.value)
    with caplog.at_level(logging.ERROR):
        logging.getLogger("rabbitmq_amqp_python_client.connection").error(
            "Error closing connection: %s", "Connection amqp://guest:s3cret@127.0.0.1:5672 timed out")
    assert "s3cret" not in caplog.text and "guest:***@" in caplog.text


def _sockets_to(port: int) -> int:
    """This process's TCP sockets connected to ``port`` on loopback (from /proc: any state, CLOSE_WAIT too)."""
    import os

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, gone
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[9] in inodes:
            count += 1
    return count


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc to count sockets")
def test_an_open_that_times_out_closes_its_socket_and_a_close_waits_at_most_a_second() -> None:
    """Through a load balancer, a node that does not answer times the open out: proton left that socket open
    (half-closed once the LB gave up), one descriptor lost per attempt.  Each is closed now."""
    import threading
    import time

    from smartclient.amqp10._rabbitmq_amqp import CLOSE_WAIT

    accepted: list[socket.socket] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]

        def serve() -> None:  # accepts, never answers: the open times out
            while True:
                try:
                    accepted.append(server.accept()[0])
                except OSError:
                    return
        threading.Thread(target=serve, daemon=True).start()
        began = time.monotonic()
        for attempt in range(5):
            with pytest.raises(ConnectionFailed, match="timed out"):
                open_connection(Address("127.0.0.1", port), login=Login("PLAIN", "u", "p"), vhost="/",
                                name=f"n{attempt}", timeout=0.2)
        assert time.monotonic() - began < 5 * 0.2 + 5 * CLOSE_WAIT + 2
        deadline = time.monotonic() + 5
        while _sockets_to(port) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _sockets_to(port) == 0, "a timed-out open kept its socket"
        for peer in accepted:
            peer.close()


def _tls_server(ca: Any, stop: list[bool]) -> int:
    """A loopback TLS server whose certificate (for ``localhost``) ``ca`` issued: it shakes hands, then says
    nothing (an AMQP open times out after a good handshake)."""
    import ssl
    import threading

    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server_context)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)

    def serve() -> None:
        held = []
        while not stop[0]:
            try:
                raw = listener.accept()[0]
            except OSError:
                continue
            try:
                held.append(server_context.wrap_socket(raw, server_side=True))
            except (OSError, ssl.SSLError):
                raw.close()
        for peer in held:
            peer.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def test_tls_trusts_the_contexts_cas_and_those_only_and_a_certificate_that_cannot_load_is_typed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Proton reads CAs and certificates from files: the context's CAs are written once to a file of their own and
    are the only ones trusted, even where OpenSSL's defaults (here ``SSL_CERT_FILE``) trust the server's CA."""
    import ssl

    import trustme

    from smartclient import CertificateRejected, ClientCertificate
    from smartclient.amqp10._rabbitmq_amqp import _ssl_domain
    from smartclient.amqp10.ca_files import ca_file_of as _ca_file

    ours, theirs = trustme.CA(), trustme.CA()
    context = ssl.create_default_context(cadata=ours.cert_pem.bytes().decode())
    path = _ca_file(context)
    assert path is not None and Path(path).read_bytes().strip() == ours.cert_pem.bytes().strip()
    assert _ca_file(ssl.create_default_context(cadata=ours.cert_pem.bytes().decode())) == path  # written once
    assert _ca_file(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)) is None  # none of its own: the system's
    theirs.cert_pem.write_to_path(tmp_path / "theirs.pem")
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "theirs.pem"))  # "the system" trusts their CA
    stop = [False]
    port = _tls_server(theirs, stop)
    try:
        login = Login("PLAIN", "u", "p")
        with pytest.raises(CertificateRejected, match="certificate verify failed"):  # theirs: not trusted
            open_connection(Address("127.0.0.1", port), login=login, vhost="/", name="pinned", timeout=3,
                            tls=context, tls_name="localhost")
        trusting = ssl.create_default_context(cadata=theirs.cert_pem.bytes().decode())
        with pytest.raises(ConnectionFailed, match="timed out") as caught:  # the handshake passes; then silence
            open_connection(Address("127.0.0.1", port), login=login, vhost="/", name="trusted", timeout=1,
                            tls=trusting, tls_name="localhost")
        assert not isinstance(caught.value, CertificateRejected)
        with pytest.raises(CertificateRejected, match="certificate verify failed"):  # the name is checked
            open_connection(Address("127.0.0.1", port), login=login, vhost="/", name="named", timeout=3,
                            tls=trusting, tls_name="elsewhere.example")
    finally:
        stop[0] = True
    issued = ours.issue_cert("client")
    issued.private_key_and_cert_chain_pem.write_to_path(tmp_path / "client.pem")
    _ssl_domain(context, ClientCertificate(tmp_path / "client.pem"))  # loads
    with pytest.raises(CertificateRejected, match="missing.pem.*cannot be loaded"):
        _ssl_domain(context, ClientCertificate(tmp_path / "missing.pem"))


def test_the_seams_container_is_protons_without_the_default_tls_configuration() -> None:
    """proton's ``Container()`` loads the system's CA store twice (an SSLConfig) for every blocking connection,
    plain ones too; the seam's sets up everything else its constructor does, and no SSLConfig."""
    from rabbitmq_amqp_python_client.qpid.proton.reactor import Container

    from smartclient.amqp10._rabbitmq_amqp import _Container

    theirs, ours = Container(), _Container()
    assert set(vars(ours)) - {"smartclient_connection", "smartclient_left"} == set(vars(theirs))
    assert ours.ssl is None and theirs.ssl is not None
    assert type(ours.global_handler) is type(theirs.global_handler)
    assert ours.container_id != _Container().container_id and ours.allow_insecure_mechs and ours.trigger is None
