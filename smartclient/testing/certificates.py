"""TLS material for the test bed: one CA (trustme) and a certificate per node.

Each node's certificate names ``rabbit-N.smartclient.test`` (what its TLS
listener advertises), ``lb.smartclient.test`` (the load balancer's name),
``localhost`` and ``127.0.0.1``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from smartclient._errors import PrerequisiteMissing
from smartclient.testing.layout import BrokerSpec

__all__ = ["LB_TLS_NAME", "ensure_certificates"]

LB_TLS_NAME = "lb.smartclient.test"


def ensure_certificates(directory: Path, specs: Iterable[BrokerSpec]) -> Path:
    """Write ``ca.pem`` and ``<node>.pem``/``<node>.key`` into ``directory`` unless present; return the CA file."""
    specs = list(specs)
    ca_file = directory / "ca.pem"
    if ca_file.exists() and all((directory / f"{s.short}.key").exists() for s in specs):
        return ca_file
    try:
        import trustme
    except ImportError as exc:
        raise PrerequisiteMissing(
            "the test bed's TLS listeners need trustme: pip install 'smartclient[testbed]'"
        ) from exc
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="smartclient test bed")
    for spec in specs:
        cert = ca.issue_cert(spec.tls_name, LB_TLS_NAME, "localhost", "127.0.0.1")
        (directory / f"{spec.short}.pem").write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
        key = directory / f"{spec.short}.key"
        key.write_bytes(cert.private_key_pem.bytes())
        key.chmod(0o600)
    ca.cert_pem.write_to_path(str(ca_file))
    return ca_file
