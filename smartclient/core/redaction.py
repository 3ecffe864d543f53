"""Keep credentials out of logs, including those of the libraries underneath.

rstream logs every frame it sends at DEBUG, ``SaslAuthenticate`` included, whose data is
``\\0user\\0password``.  :func:`install_log_redaction` adds a filter to rstream's loggers that replaces
that record's text, so turning on DEBUG logging never prints a password.
"""

from __future__ import annotations

import logging

__all__ = ["install_log_redaction"]

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
