"""A local Spark session that keeps to loopback and runs this interpreter's Python on its executors; and the
``rabbitmq_stream`` format registered on any session, a Spark Connect one checked first."""

from __future__ import annotations

import os
import sys
from typing import Any

from smartclient._errors import ConfigurationError

__all__ = ["local_session", "register_format"]


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


def register_format(spark: Any) -> None:
    """Register the ``rabbitmq_stream`` format (:class:`~smartclient.spark.RabbitStreamDataSource`) on ``spark``.

    On a Spark Connect session the class is pickled here and imported by the server's Python workers, so this first
    runs one tiny job there that imports smartclient: a server whose Python lacks it is said at once, not as a
    ``ModuleNotFoundError`` deep in the first query's plan.

    :raises ConfigurationError: the Connect server's Python workers cannot import smartclient."""
    from smartclient.spark._pyspark import is_connect_session
    from smartclient.spark.source import RabbitStreamDataSource

    if not callable(getattr(getattr(spark, "dataSource", None), "register", None)):
        raise ConfigurationError(f"register_format needs a SparkSession (its dataSource.register), not "
                                 f"{type(spark).__name__}")
    if is_connect_session(spark):
        from smartclient.spark._pyspark import functions as F

        probe = F.udf(smartclient_importable, "string", useArrow=False)
        try:
            spark.range(1).select(probe(F.lit(0))).collect()
        except Exception as exc:
            if "No module named 'smartclient'" not in str(exc):
                raise
            raise ConfigurationError(
                "the Spark Connect server's Python workers cannot import smartclient, and the rabbitmq_stream format "
                "runs there: install smartclient[spark] into the Python the server runs (spark.pyspark.python)"
            ) from None
    spark.dataSource.register(RabbitStreamDataSource)


def smartclient_importable(_: Any) -> str:
    """Run on a Connect server's Python worker by :func:`register_format`: unpickling it imports smartclient."""
    import smartclient

    return str(smartclient.__version__)
