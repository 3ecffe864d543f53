"""A local Spark session that keeps to loopback and runs this interpreter's Python on its executors."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_session"]


def local_session(master: str = "local[2]", app_name: str = "smartclient", *, log_level: str = "ERROR",
                  **config: str) -> Any:
    """``SparkSession`` on ``master`` (``local[2]``; ``local[2,4]`` retries failed tasks up to 4 times):
    every socket on 127.0.0.1, no UI, 4 shuffle partitions, the executors on ``sys.executable``.
    Extra ``config`` entries are passed as Spark configuration (``spark_driver_memory="1g"`` for
    ``spark.driver.memory``)."""
    from smartclient.spark._pyspark import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4"))
    for key, value in config.items():
        builder = builder.config(key.replace("_", "."), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session
