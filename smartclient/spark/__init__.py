"""Spark helpers (``pip install 'smartclient[spark]'``): an exactly-once foreachBatch sink and a
stream source for the Python Data Source API (PySpark 4.0+).  pyspark is imported lazily."""

from __future__ import annotations

from typing import Any

from smartclient.spark.config import StreamConnection
from smartclient.spark.sink import ExactlyOnceSink, row_to_message

__all__ = [
    "ExactlyOnceSink", "RabbitStreamDataSource", "StreamConnection", "local_session", "next_offsets", "offsets_behind",
    "register_format",
    "row_to_message",
]


def __getattr__(name: str) -> Any:
    if name in ("local_session", "register_format"):
        from smartclient.spark import session

        return getattr(session, name)
    if name in ("RabbitStreamDataSource", "next_offsets", "offsets_behind"):  # needs pyspark: imported on first use
        from smartclient.spark import source

        return getattr(source, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
