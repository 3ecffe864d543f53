"""The CAs of an ``ssl.SSLContext`` as a PEM file: proton reads its trusted CAs only from files (``_ssl_domain`` in
the seam).  Each set of CAs is written once, and every file and directory made for it is removed at exit."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import ssl
import tempfile
import threading

__all__ = ["CA_LOCK", "ca_file_of", "remove_at_exit"]

#: held while a file is written, and while the seam points OpenSSL's default CAs at one (process-wide settings)
CA_LOCK = threading.Lock()
_FILES: dict[bytes, str] = {}
_MADE: list[str] = []  # every file and directory to remove at exit


def remove_at_exit(path: str) -> str:
    """``path`` (a file, or an empty directory), removed when the interpreter exits; returned."""
    if not _MADE:
        atexit.register(_remove)
    _MADE.append(path)
    return path


def ca_file_of(context: ssl.SSLContext) -> str | None:
    """A PEM file of the CAs ``context`` trusts (None: it holds none of its own), written once per set of CAs
    and removed at exit."""
    pem = "".join(ssl.DER_cert_to_PEM_cert(der) for der in context.get_ca_certs(binary_form=True)).encode()
    if not pem:
        return None
    key = hashlib.sha256(pem).digest()
    with CA_LOCK:
        path = _FILES.get(key)
        if path is None or not os.path.exists(path):
            handle, path = tempfile.mkstemp(prefix="smartclient-amqp10-ca-", suffix=".pem")
            with os.fdopen(handle, "wb") as out:
                out.write(pem)
            _FILES[key] = remove_at_exit(path)
    return path


def _remove() -> None:
    for path in _MADE:
        with contextlib.suppress(OSError):
            os.rmdir(path) if os.path.isdir(path) else os.remove(path)
