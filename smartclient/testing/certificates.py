"""TLS material for the test bed: one CA (trustme), a certificate per node, and client certificates.

Each node's certificate names ``rabbit-N.smartclient.test`` (what its TLS
listener advertises), ``lb.smartclient.test`` (the load balancer's name),
``localhost`` and ``127.0.0.1``.  The CA's key is kept beside ``ca.pem``, so
that client certificates can be issued later (:func:`issue_client_certificate`);
a bed whose CA has no key (written before client certificates) gets a new CA
and new node certificates, and its nodes restart on the next ``up()``
(:func:`ca_fingerprint` is part of their config).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smartclient._errors import ConfigurationError, PrerequisiteMissing, TestBedError
from smartclient.testing.layout import BrokerSpec

__all__ = [
    "LB_TLS_NAME",
    "ClientCertificate",
    "ca_fingerprint",
    "current_client_certificate",
    "ensure_certificates",
    "issue_client_certificate",
]

LB_TLS_NAME = "lb.smartclient.test"
CLIENTS_DIR = "clients"
_COMMON_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate the bed's CA issued, for SASL EXTERNAL: the broker user is its common name."""

    common_name: str
    cert_file: Path  #: the certificate (PEM)
    key_file: Path  #: its private key (PEM)


def _trustme() -> Any:
    try:
        import trustme
    except ImportError as exc:
        raise PrerequisiteMissing(
            "the test bed's TLS listeners need trustme: pip install 'smartclient[testbed]'"
        ) from exc
    return trustme


def ensure_certificates(directory: Path, specs: Iterable[BrokerSpec]) -> Path:
    """Write ``ca.pem``/``ca.key`` and ``<node>.pem``/``<node>.key`` into ``directory`` unless present; return
    the CA file."""
    specs = list(specs)
    ca_file = directory / "ca.pem"
    if (ca_file.exists() and (directory / "ca.key").exists()
            and all((directory / f"{s.short}.key").exists() for s in specs)):
        return ca_file
    trustme = _trustme()
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="smartclient test bed")
    for spec in specs:
        cert = ca.issue_cert(spec.tls_name, LB_TLS_NAME, "localhost", "127.0.0.1")
        (directory / f"{spec.short}.pem").write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
        _write_key(directory / f"{spec.short}.key", cert.private_key_pem.bytes())
    _write_key(directory / "ca.key", ca.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(ca_file))
    return ca_file


def ca_fingerprint(directory: Path) -> str:
    """The first 16 hex digits of the SHA-256 of ``ca.pem`` (empty if there is none yet)."""
    ca_file = directory / "ca.pem"
    return hashlib.sha256(ca_file.read_bytes()).hexdigest()[:16] if ca_file.exists() else ""


def _write_key(path: Path, pem: bytes) -> None:
    path.write_bytes(pem)
    path.chmod(0o600)


def _check_common_name(common_name: str) -> None:
    if not _COMMON_NAME.fullmatch(common_name):
        raise ConfigurationError(
            f"client certificate common name {common_name!r}: use letters, digits, '.', '_' and '-' "
            f"(at most 63), as it is also a broker user name and a file name"
        )


def _issued(directory: Path, common_name: str) -> list[tuple[int, Path]]:
    found = []
    for path in (directory / CLIENTS_DIR).glob(f"{common_name}.*.pem"):
        number = path.name[len(common_name) + 1:-len(".pem")]
        if number.isdigit():
            found.append((int(number), path))
    return sorted(found)


def current_client_certificate(directory: Path, common_name: str) -> ClientCertificate | None:
    """The newest client certificate issued for ``common_name`` in ``directory``, or None."""
    _check_common_name(common_name)
    issued = _issued(directory, common_name)
    if not issued:
        return None
    cert_file = issued[-1][1]
    return ClientCertificate(common_name, cert_file, cert_file.with_suffix(".key"))


def issue_client_certificate(directory: Path, common_name: str) -> ClientCertificate:
    """Issue a new client certificate for ``common_name`` from the CA in ``directory`` (a new key pair and
    serial), in new files ``clients/<common_name>.<n>.pem`` and ``.key``; the older ones stay valid.

    :raises TestBedError: the CA has no key in ``directory`` (run ``up()`` first)."""
    _check_common_name(common_name)
    ca_key = directory / "ca.key"
    if not ca_key.exists():
        raise TestBedError(f"the test bed's CA has no key in {directory}: bring the bed up first")
    trustme = _trustme()
    ca = trustme.CA.from_pem((directory / "ca.pem").read_bytes(), ca_key.read_bytes())
    # trustme marks the subject alternative names critical, and Erlang refuses a critical extension left empty
    cert = ca.issue_cert(f"{common_name}@clients.smartclient.test", common_name=common_name)
    issued = _issued(directory, common_name)
    number = issued[-1][0] + 1 if issued else 1
    (directory / CLIENTS_DIR).mkdir(parents=True, exist_ok=True)
    cert_file = directory / CLIENTS_DIR / f"{common_name}.{number}.pem"
    key_file = cert_file.with_suffix(".key")
    _write_key(key_file, cert.private_key_pem.bytes())
    cert_file.write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
    return ClientCertificate(common_name, cert_file, key_file)
