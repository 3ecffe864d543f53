"""Keep credentials out of logs, including those of the libraries underneath.

rstream logs every frame it sends at DEBUG, ``SaslAuthenticate`` included, whose data is
``\\0user\\0password``.  :func:`install_log_redaction` adds a filter to rstream's loggers that replaces
that record's text, so turning on DEBUG logging never prints a password.

The official AMQP 1.0 client (and proton under it) puts its connection URI, password included, in its errors
and in what it logs: :func:`without_uri_passwords` takes them out of a text, and :func:`install_uri_redaction`
out of every record of the loggers named.
"""

from __future__ import annotations

import logging
import re

__all__ = ["install_log_redaction", "install_marked_redaction", "install_uri_redaction", "without_uri_passwords"]

_URI_SECRET = re.compile(r"([a-z][a-z0-9+.-]*://[^:/@\s'\"]*):[^@\s'\"]*@", re.IGNORECASE)

_LOGGERS = ("rstream", "rstream.client", "rstream.connection", "rstream.producer", "rstream.consumer")


class _SaslRedaction(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if "SaslAuthenticate" in str(record.msg) or any("SaslAuthenticate" in repr(a) for a in _args(record)):
            record.msg = "Sending frame: SaslAuthenticate(<redacted by smartclient>)"
            record.args = ()
        return True


def _args(record: logging.LogRecord) -> tuple[object, ...]:
    args = record.args
    if isinstance(args, tuple):
        return args
    return (args,) if args else ()


_FILTER = _SaslRedaction()


def install_log_redaction() -> None:
    """Idempotent: add the redaction filter to rstream's loggers (filters run before any handler)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def without_uri_passwords(text: str) -> str:
    """``text`` with the password of every URI in it (``scheme://user:password@``) replaced by ``***``."""
    return _URI_SECRET.sub(r"\1:***@", text) if "://" in text else text


class _UriRedaction(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = without_uri_passwords(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


_URI_REDACTION = _UriRedaction()


def install_uri_redaction(*loggers: str) -> None:
    """Redact URI passwords in every record of the loggers named (idempotent)."""
    for name in loggers:
        logger = logging.getLogger(name)
        if _URI_REDACTION not in logger.filters:
            logger.addFilter(_URI_REDACTION)


class _MarkedRedaction(logging.Filter):
    """Replaces every record whose message holds ``marker`` by ``replacement`` (a request carrying a secret)."""

    def __init__(self, marker: str, replacement: str) -> None:
        super().__init__()
        self.marker, self.replacement = marker, replacement

    def filter(self, record: logging.LogRecord) -> bool:
        if self.marker in record.getMessage():
            record.msg, record.args = self.replacement, ()
        return True


def install_marked_redaction(logger: str, marker: str, replacement: str) -> None:
    """Idempotent: every record of ``logger`` whose message holds ``marker`` is logged as ``replacement``."""
    target = logging.getLogger(logger)
    if not any(isinstance(f, _MarkedRedaction) and f.marker == marker for f in target.filters):
        target.addFilter(_MarkedRedaction(marker, replacement))
