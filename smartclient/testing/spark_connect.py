"""A Spark Connect server on the test bed's standalone cluster, from the installed pyspark.

    python -m smartclient.testing spark connect      # the cluster, then the server on it
    SparkSession.builder.remote(ConnectServer.from_env().url).getOrCreate()

The server is a Spark application of the cluster (``SparkSubmit`` of ``SparkConnectServer``, its own JVM, its
driver on 127.0.0.1) with its gRPC port at the cluster's port base + 50 (``sc://127.0.0.1:27050``).  It takes one
executor of 1 core per worker, as the cluster's classic test session does, so the two are not run at once: the
pytest plugin stops one before it starts the other.  Its Python (the driver's Python workers, which plan Python
data sources and run ``foreachBatch`` functions, and the executors') is this interpreter with this driver's
``sys.path``, so smartclient is importable there; ``python=`` names another (a server without smartclient).

Its log and PID file live beside the cluster's (``<cache>/spark/connect*``); the JVM carries
``SMARTCLIENT_SPARK_DAEMON=<state dir>/connect`` in its environment, as the cluster's daemons do, so a live server
is told from a reused PID.  ``start()`` is idempotent; ``stop()`` ends it by PID.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from smartclient._errors import TestBedError
from smartclient.testing.processes import (
    find_pids_with_env,
    kill_pid,
    pid_alive,
    port_accepts,
    read_pid,
    wait_until,
)
from smartclient.testing.spark_cluster import IDENTITY, SparkCluster, executor_python_path

__all__ = ["CONNECT_CLASS", "ConnectServer"]

log = logging.getLogger(__name__)

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"
PORT_OFFSET = 50


class ConnectServer:
    """The Connect server of ``cluster``, run with ``python`` for its Python workers."""

    def __init__(self, cluster: SparkCluster, python: str = sys.executable, name: str = "connect",
                 port: int | None = None, master: str | None = None) -> None:
        self.cluster = cluster
        self.python = python
        self.name = name
        self.port = port if port is not None else cluster.port_base + PORT_OFFSET
        self.master = master  # None: the cluster's; "local[1]": a server of its own, beside the cluster's
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ConnectServer:
        return cls(SparkCluster.from_env(env))

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def _identity(self) -> str:
        return f"{IDENTITY}={self.cluster.state_dir / self.name}"

    @property
    def _log(self) -> Path:
        return self.cluster.state_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        pid = read_pid(self.cluster.state_dir / f"{self.name}.pid")
        if pid_alive(pid, must_contain=CONNECT_CLASS, env_entry=self._identity):
            return pid
        found = find_pids_with_env(self._identity, must_contain=CONNECT_CLASS)
        return found[0] if found else None

    def _command(self) -> list[str]:
        settings = {
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false", "spark.executor.cores": "1", "spark.executor.memory": "512m",
            "spark.driver.memory": "1g", "spark.cores.max": str(self.cluster.worker_count),
            "spark.task.maxFailures": "4", "spark.sql.shuffle.partitions": "4",
            "spark.pyspark.python": self.python, "spark.pyspark.driver.python": self.python,
            "spark.executorEnv.PYTHONPATH": executor_python_path() if self.python == sys.executable else "",
        }
        confs = [item for key, value in settings.items() for item in ("--conf", f"{key}={value}")]
        return [str(self.cluster.spark_home / "bin" / "spark-class"), SUBMIT_CLASS,
                "--master", self.master or self.cluster.master_url,
                "--class", CONNECT_CLASS, "--name", f"smartclient-{self.name}", *confs, "spark-internal"]

    def _env(self) -> dict[str, str]:
        env = self.cluster._env(self.name)  # the daemons' environment, with this server's identity
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = self.python
        if self.python == sys.executable:
            env["PYTHONPATH"] = executor_python_path()
        return env

    def start(self, timeout: float = 180.0) -> bool:
        """Start the cluster, then the server if it does not run; return once it accepts on its port (True when
        it was started here).

        :raises TestBedError: it exited, or did not accept within ``timeout`` s (with the end of its log)."""
        if self.master is None:
            self.cluster.start()
        self.cluster.state_dir.mkdir(parents=True, exist_ok=True)
        if self.pid() is not None:
            self._wait_port(timeout)
            return False
        with self._log.open("ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(self._command(), env=self._env(), stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          cwd=self.cluster.state_dir)  # (a checkout's cwd would put it on sys.path)
        (self.cluster.state_dir / f"{self.name}.pid").write_text(f"{self._proc.pid}\n")
        log.info("started the Spark Connect server %s (PID %d)", self.url, self._proc.pid)
        self._wait_port(timeout)
        return True

    def _wait_port(self, timeout: float) -> None:
        def ready() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise TestBedError(f"the Spark Connect server exited ({self._proc.returncode}): {self._tail()}")
            return port_accepts(self.port)

        try:
            wait_until(ready, timeout, f"the Spark Connect server on {self.url}", interval=0.25)
        except TestBedError as exc:
            raise TestBedError(f"{exc}; {self._tail()}") from None

    def _tail(self, lines: int = 12) -> str:
        try:
            text = self._log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"no log at {self._log}"
        return f"{self._log}: " + " | ".join(text)

    def stop(self, timeout: float = 20.0) -> None:
        """End the server by PID (SIGTERM, then SIGKILL), and wait until its port is free."""
        pid = self.pid()
        if pid is not None:
            try:
                kill_pid(pid, signal.SIGTERM, timeout)
            except TestBedError:
                kill_pid(pid, signal.SIGKILL, timeout)
        if self._proc is not None:
            self._proc.wait(timeout)
            self._proc = None
        wait_until(lambda: not port_accepts(self.port), timeout, f"the Spark Connect server's port {self.port} freed")

    def session(self, new: bool = False) -> Any:
        """A Spark Connect session on this server (``new``: another one even when this process has a session)."""
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.remote(self.url)
        return builder.create() if new else builder.getOrCreate()
