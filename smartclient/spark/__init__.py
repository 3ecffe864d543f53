"""Spark helpers (``pip install 'smartclient[spark]'``): an exactly-once foreachBatch sink and a
stream source for the Python Data Source API (PySpark 4.0+).  pyspark is imported lazily."""

from __future__ import annotations

from .config import StreamConnection
from .sink import ExactlyOnceSink, row_to_message

__all__ = ["ExactlyOnceSink", "StreamConnection", "row_to_message"]
