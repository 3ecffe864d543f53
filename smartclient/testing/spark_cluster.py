"""A Spark standalone cluster on loopback: a master and two workers, each its own JVM, from the installed pyspark.

    python -m smartclient.testing spark up|status|down

Every process is started with ``<pyspark>/bin/spark-class`` (which ``exec``\\ s the JVM, so the PID the test bed
records is the JVM's) in its own session, and every port is on 127.0.0.1 at ``base + offset`` with base 27000
(``SMARTCLIENT_SPARK_PORT_BASE``): above both RabbitMQ test beds (20000-22399 for 4.3, 23000-25399 for 4.0) and
below the kernel's ephemeral range.

* ``base + 77``: the master (``spark://127.0.0.1:27077``); ``base + 80``: its web UI and JSON status;
* ``base + 80 + i``: worker ``i``'s web UI; ``base + 90 + i``: its RPC port (1 core and 1 GiB each).

Logs, PID files and the workers' work directories live in ``<cache>/spark`` (``/var/cache/smartclient/spark``;
the cache is ``SMARTCLIENT_TESTBED_CACHE``, as for the RabbitMQ chroots).  Each daemon carries
``SMARTCLIENT_SPARK_DAEMON=<state dir>/<name>`` in its environment, and the executors a worker launches inherit it:
that entry, with the JVM's main class, tells a live daemon from a reused PID, and finds an executor whose worker
died.

``start()`` is idempotent: what runs is kept, what does not is started, and it returns once the master lists
every worker ALIVE.  :meth:`SparkCluster.kill_worker` is a machine crash (``kill -9`` by PID of the worker, its
executors and their Python workers); :meth:`SparkCluster.restart_worker` brings the worker back.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from smartclient._errors import PrerequisiteMissing, TestBedError
from smartclient.testing.layout import Layout
from smartclient.testing.prerequisites import require_java
from smartclient.testing.processes import (
    ephemeral_port_range,
    find_pids_with_env,
    kill_pid,
    pid_alive,
    port_accepts,
    port_is_free,
    read_pid,
    wait_until,
)

__all__ = ["DEFAULT_SPARK_PORT_BASE", "SparkCluster", "SparkWorker", "executor_python_path"]

log = logging.getLogger(__name__)

DEFAULT_SPARK_PORT_BASE = 27000
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
IDENTITY = "SMARTCLIENT_SPARK_DAEMON"
#: seconds without a heartbeat before the master declares a worker dead (Spark's default is 60); a worker
#: killed by PID is seen at once anyway, through its closed connection
WORKER_TIMEOUT = 10
MAX_WORKERS = 9
#: the daemons' own configuration (``--properties-file``): no REST submission server (it would bind 6066)
DAEMON_PROPERTIES = {
    "spark.master.rest.enabled": "false",
    "spark.worker.timeout": str(WORKER_TIMEOUT),
    "spark.worker.cleanup.enabled": "true",
}


class SparkWorker(NamedTuple):
    """A worker as the master lists it: its id (None while the master does not list it) and its PID (None when
    it does not run)."""

    id: str | None
    pid: int | None


def executor_python_path(extra: Iterable[str] = ()) -> str:
    """``PYTHONPATH`` for executors, which run with the worker's work directory as their current directory: the
    directory smartclient is imported from, and every directory on the driver's ``sys.path`` (``''`` is the
    driver's current directory), so a function pickled by reference imports there as it does here."""
    import smartclient

    entries = [*extra, str(Path(smartclient.__file__).resolve().parents[1])]
    entries += [p or os.getcwd() for p in sys.path]
    seen: list[str] = []
    for entry in entries:
        path = str(Path(entry).resolve())
        if path not in seen and Path(path).is_dir():
            seen.append(path)
    return os.pathsep.join(seen)


def _ppids() -> dict[int, int]:
    """``{pid: parent pid}`` of every process, from ``/proc/<pid>/stat``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
    return parents


def _exited(pid: int) -> bool:
    return not pid_alive(pid)


def _descendants(roots: Iterable[int]) -> list[int]:
    """Every live descendant of ``roots`` (children first found first), from one snapshot of ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppids().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and pid_alive(child):
                found.append(child)
                todo.append(child)
    return found


class SparkCluster:
    """A Spark standalone master and ``workers`` workers (1 core, 1 GiB each), as separate processes."""

    def __init__(self, state_dir: Path, port_base: int = DEFAULT_SPARK_PORT_BASE, workers: int = 2) -> None:
        if not 1 <= workers <= MAX_WORKERS:
            raise TestBedError(f"a test-bed Spark cluster has 1 to {MAX_WORKERS} workers, not {workers}")
        self.state_dir = state_dir
        self.port_base = port_base
        self.worker_count = workers
        self._procs: dict[str, subprocess.Popen[bytes]] = {}  # what this process started, to reap it

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> SparkCluster:
        """State under ``Layout.from_env().cache_dir / "spark"``, port base ``SMARTCLIENT_SPARK_PORT_BASE``."""
        env = os.environ if environ is None else environ
        raw = env.get("SMARTCLIENT_SPARK_PORT_BASE") or str(DEFAULT_SPARK_PORT_BASE)
        try:
            base = int(raw)
        except ValueError:
            raise TestBedError(f"SMARTCLIENT_SPARK_PORT_BASE={raw!r} is not a whole number") from None
        return cls(Layout.from_env(dict(env)).cache_dir / "spark", port_base=base)

    # -- addresses ---------------------------------------------------------------------
    @property
    def master_port(self) -> int:
        return self.port_base + 77

    @property
    def master_ui_port(self) -> int:
        return self.port_base + 80

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def worker_port(self, index: int) -> int:
        return self.port_base + 90 + self._check_index(index)

    def worker_ui_port(self, index: int) -> int:
        return self.port_base + 80 + self._check_index(index)

    def _check_index(self, index: int) -> int:
        if not 1 <= index <= self.worker_count:
            raise TestBedError(f"no worker {index}: the Spark cluster has workers 1..{self.worker_count}")
        return index

    @property
    def spark_home(self) -> Path:
        try:
            import pyspark
        except ImportError:
            raise PrerequisiteMissing(
                "pyspark is not installed, and the Spark cluster runs from it: pip install 'smartclient[spark]'"
            ) from None
        return Path(pyspark.__file__).resolve().parent

    # -- processes ---------------------------------------------------------------------
    def _daemons(self) -> list[str]:
        return ["master", *(f"worker-{i}" for i in range(1, self.worker_count + 1))]

    def _identity(self, name: str) -> str:
        return f"{IDENTITY}={self.state_dir / name}"

    def _main_class(self, name: str) -> str:
        return MASTER_CLASS if name == "master" else WORKER_CLASS

    def _pid(self, name: str) -> int | None:
        """The daemon's JVM: from its PID file, checked against its main class and identity; else found in /proc."""
        identity, main = self._identity(name), self._main_class(name)
        pid = read_pid(self.state_dir / f"{name}.pid")
        if pid_alive(pid, must_contain=main, env_entry=identity):
            return pid
        found = find_pids_with_env(identity, must_contain=main)
        return found[0] if found else None

    def master_pid(self) -> int | None:
        return self._pid("master")

    def worker_pid(self, index: int) -> int | None:
        return self._pid(f"worker-{self._check_index(index)}")

    def running(self) -> bool:
        """True when the master and every worker run (whether the master lists them yet or not)."""
        return all(self._pid(name) is not None for name in self._daemons())

    def _command(self, name: str) -> list[str]:
        spark_class = str(self.spark_home / "bin" / "spark-class")
        props = ["--properties-file", str(self.state_dir / "spark-daemons.conf")]
        if name == "master":
            return [spark_class, MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.master_port),
                    "--webui-port", str(self.master_ui_port), *props]
        index = int(name.split("-")[1])
        work = self.state_dir / name / "work"
        return [spark_class, WORKER_CLASS, "--host", "127.0.0.1", "--port", str(self.worker_port(index)),
                "--cores", "1", "--memory", "1g", "--webui-port", str(self.worker_ui_port(index)),
                "--work-dir", str(work), *props, self.master_url]

    def _env(self, name: str) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("SPARK_HOME", "SPARK_CONF_DIR", "PYSPARK_DRIVER_PYTHON"):  # the installed pyspark's own
            env.pop(key, None)
        env.update({
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.state_dir),
            "PYSPARK_PYTHON": sys.executable,
            IDENTITY: str(self.state_dir / name),
        })
        return env

    def _log_file(self, name: str) -> Path:
        return self.state_dir / f"{name}.log"

    def _launch(self, name: str) -> None:
        if name != "master":
            (self.state_dir / name / "work").mkdir(parents=True, exist_ok=True)
        with self._log_file(name).open("ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}\n".encode())
            out.flush()
            proc = subprocess.Popen(self._command(name), env=self._env(name), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        (self.state_dir / f"{name}.pid").write_text(f"{proc.pid}\n")
        self._procs[name] = proc
        log.info("started Spark %s (PID %d)", name, proc.pid)

    def _wait(self, check: Callable[[], bool], timeout: float, what: str, watch: Sequence[str]) -> None:
        """:func:`wait_until` ``check``, failing at once (with the end of its log) when a daemon of ``watch`` that
        this process started exits, and with the end of their logs at the deadline."""
        exited: list[str] = []

        def step() -> bool:
            exited.extend(name for name in watch if name in self._procs and self._procs[name].poll() is not None)
            return bool(exited) or check()

        try:
            wait_until(step, timeout, what, interval=0.25)
        except TestBedError as exc:
            raise TestBedError(f"{exc}; " + "; ".join(self._log_tail(name, 8) for name in watch)) from None
        if exited:
            name = exited[0]
            code = self._procs.pop(name).returncode
            raise TestBedError(f"Spark {name} exited with status {code} as it started: {self._log_tail(name)}")

    def _log_tail(self, name: str, lines: int = 15) -> str:
        try:
            tail = self._log_file(name).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"no log at {self._log_file(name)}"
        return f"the end of {self._log_file(name)}:\n" + "\n".join(tail)

    def _check_prerequisites(self) -> None:
        require_java(17)
        spark_class = self.spark_home / "bin" / "spark-class"
        if not os.access(spark_class, os.X_OK):
            raise PrerequisiteMissing(f"{spark_class} is missing or not executable: reinstall pyspark")
        low, high = ephemeral_port_range()
        wanted = [(self.master_port, "master", "the Spark master"),
                  (self.master_ui_port, "master", "the Spark master's web UI")]
        for i in range(1, self.worker_count + 1):
            wanted += [(self.worker_port(i), f"worker-{i}", f"Spark worker {i}"),
                       (self.worker_ui_port(i), f"worker-{i}", f"Spark worker {i}'s web UI")]
        running = {name for name in self._daemons() if self._pid(name) is not None}
        for port, owner, what in wanted:
            if low <= port <= high:
                raise PrerequisiteMissing(
                    f"port {port} ({what}) lies in the kernel's ephemeral range {low}-{high}: set "
                    f"SMARTCLIENT_SPARK_PORT_BASE lower (now {self.port_base})")
            if owner not in running and not port_is_free(port):
                raise PrerequisiteMissing(
                    f"port {port} ({what}) is taken by another process: free it, or move the Spark cluster with "
                    f"SMARTCLIENT_SPARK_PORT_BASE (now {self.port_base})")

    # -- up / down ---------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> list[str]:
        """Start what does not run, then wait until the master lists every worker ALIVE; return what was done
        (empty when everything already ran)."""
        self._check_prerequisites()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "spark-daemons.conf").write_text(
            "".join(f"{key} {value}\n" for key, value in DAEMON_PROPERTIES.items()))
        actions: list[str] = []
        if self.master_pid() is None:
            self._launch("master")
            actions.append(f"started the Spark master ({self.master_url})")
        self._wait_master(timeout)
        for i in range(1, self.worker_count + 1):
            if self.worker_pid(i) is None:
                self._wait_worker_gone(i, timeout)  # a dead worker's address is refused while listed ALIVE
                self._launch(f"worker-{i}")
                actions.append(f"started Spark worker {i}")
        self.wait_ready(timeout)
        return actions

    def _wait_master(self, timeout: float) -> None:
        self._wait(lambda: self.master_status().get("status") == "ALIVE", timeout,
                   f"the Spark master's status on port {self.master_ui_port}", ["master"])

    def master_status(self) -> dict[str, Any]:
        """The master's JSON status (``/json/``): its workers with id, host, port and state, and its apps."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        with opener.open(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=5) as answer:
            status: dict[str, Any] = json.loads(answer.read())
        return status

    def _listed(self, index: int) -> dict[str, Any] | None:
        """The master's entry for worker ``index`` that is ALIVE (a restarted worker gets a new id, and the
        master may keep the dead one as DEAD), else its last entry, else None."""
        port = self.worker_port(index)
        entries = [w for w in self.master_status().get("workers", []) if w.get("port") == port]
        alive = [w for w in entries if w.get("state") == "ALIVE"]
        listed: list[dict[str, Any]] = alive or entries
        return listed[-1] if listed else None

    def worker_alive(self, index: int) -> bool:
        """True when the worker runs and the master lists it ALIVE."""
        entry = self._listed(index)
        return self.worker_pid(index) is not None and entry is not None and entry.get("state") == "ALIVE"

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until the master lists every worker ALIVE."""
        indexes = range(1, self.worker_count + 1)
        self._wait(lambda: all(self.worker_alive(i) for i in indexes), timeout,
                   f"the Spark master to list {self.worker_count} workers ALIVE", [f"worker-{i}" for i in indexes])

    def _wait_worker_gone(self, index: int, timeout: float) -> None:
        def gone() -> bool:
            entry = self._listed(index)
            return entry is None or entry.get("state") != "ALIVE"

        wait_until(gone, min(timeout, WORKER_TIMEOUT * 3), f"the Spark master to drop the dead worker {index}",
                   interval=0.25)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the workers (with their executors) and the master: SIGTERM by PID, then SIGKILL after
        ``timeout`` s for whatever still runs."""
        daemons = [pid for pid in (self._pid(name) for name in reversed(self._daemons())) if pid is not None]
        pids = [*daemons, *(pid for i in range(1, self.worker_count + 1) for pid in self.executor_pids(i))]
        pids += [pid for pid in _descendants(pids) if pid not in pids]
        for pid in daemons:  # the workers first, the master last; a worker stops its executors
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for pid in pids:
            try:
                wait_until(functools.partial(_exited, pid), max(0.1, deadline - time.monotonic()),
                           f"PID {pid} to exit after SIGTERM", interval=0.1)
            except TestBedError:
                log.warning("PID %d did not exit within %.0fs of SIGTERM: SIGKILL", pid, timeout)
                kill_pid(pid)
        for name, proc in list(self._procs.items()):
            if proc.poll() is not None:  # reaped
                del self._procs[name]

    # -- executors and faults ----------------------------------------------------------
    def workers(self) -> list[SparkWorker]:
        """``(id, pid)`` of workers 1..N, in order."""
        result = []
        for i in range(1, self.worker_count + 1):
            entry = self._listed(i)
            alive = entry is not None and entry.get("state") == "ALIVE"
            result.append(SparkWorker(entry.get("id") if alive and entry else None, self.worker_pid(i)))
        return result

    def executor_pids(self, index: int) -> list[int]:
        """The executor JVMs worker ``index`` launched: its children, and any whose worker died before them."""
        worker = self.worker_pid(index)
        children = []
        if worker is not None:
            children = [pid for pid, ppid in _ppids().items()
                        if ppid == worker and pid_alive(pid, must_contain=EXECUTOR_CLASS)]
        orphans = find_pids_with_env(self._identity(f"worker-{index}"), must_contain=EXECUTOR_CLASS)
        return sorted(set(children) | set(orphans))

    def worker_of(self, pid: int) -> int | None:
        """The worker whose executor runs ``pid`` (the executor JVM, or one of its Python workers), or None."""
        ancestors = set()
        parents = _ppids()
        while pid > 1 and pid not in ancestors:
            ancestors.add(pid)
            pid = parents.get(pid, 0)
        for i in range(1, self.worker_count + 1):
            if ancestors & set(self.executor_pids(i)):
                return i
        return None

    def kill_worker(self, index: int) -> list[int]:
        """A machine crash: ``kill -9`` by PID worker ``index``, its executors and their Python workers, all at
        once; return the PIDs killed (the worker's first)."""
        worker = self.worker_pid(index)
        if worker is None:
            raise TestBedError(f"Spark worker {index} is not running: no live PID in "
                               f"{self.state_dir / f'worker-{index}.pid'}")
        executors = self.executor_pids(index)
        victims = [worker, *executors]
        victims += [p for p in _descendants(victims) if p not in victims]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in victims:
            kill_pid(pid)  # waits until it is gone
        proc = self._procs.pop(f"worker-{index}", None)
        if proc is not None:
            proc.poll()
        wait_until(lambda: not port_accepts(self.worker_port(index), timeout=0.2), 10,
                   f"the RPC port of Spark worker {index} to close")
        log.info("killed Spark worker %d (PID %d) and %s", index, worker, victims[1:])
        return victims

    def restart_worker(self, index: int, timeout: float = 120.0) -> None:
        """Start worker ``index`` again (after :meth:`kill_worker`) and wait until the master lists it ALIVE."""
        if self.worker_pid(index) is None:
            self._wait_worker_gone(index, timeout)
            self._launch(f"worker-{index}")
        self._wait(lambda: self.worker_alive(index), timeout,
                   f"the Spark master to list the restarted worker {index} ALIVE", [f"worker-{index}"])

    # -- driver ------------------------------------------------------------------------
    def session(self, app_name: str = "smartclient-cluster", *, log_level: str = "WARN",
                executor_timeout: float = 120.0, **config: str) -> Any:
        """A ``SparkSession`` on this master: every socket on 127.0.0.1, no UI, one executor of 1 core and 512 MiB
        per worker (``spark.cores.max`` = workers), tasks retried up to 4 times, 4 shuffle partitions, this
        interpreter on the executors with the driver's ``sys.path`` as their ``PYTHONPATH``.  Extra ``config``
        entries are Spark configuration (``spark_driver_memory="1g"``).  Returns once every executor registered.

        :raises TestBedError: another SparkContext (a local one) is active in this driver, or the executors did
            not register within ``executor_timeout`` s.
        """
        from pyspark.sql import SparkSession

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings = {
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.executor.cores": "1", "spark.executor.memory": "512m",
            "spark.cores.max": str(self.worker_count), "spark.task.maxFailures": "4",
            "spark.pyspark.python": sys.executable, "spark.executorEnv.PYTHONPATH": executor_python_path(),
            "spark.sql.shuffle.partitions": "4",
        }
        settings.update({key.replace("_", "."): value for key, value in config.items()})
        builder = SparkSession.builder.master(self.master_url).appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        if session.sparkContext.master != self.master_url:
            raise TestBedError(f"a SparkContext on {session.sparkContext.master} is active in this driver, and a "
                               f"driver holds one: stop it before asking for a session on {self.master_url}")
        session.sparkContext.setLogLevel(log_level)
        self.wait_executors(session, self.worker_count, executor_timeout)
        return session

    def wait_executors(self, session: Any, count: int | None = None, timeout: float = 120.0) -> int:
        """Wait until ``count`` executors (default: one per worker) registered with ``session``'s driver."""
        wanted = self.worker_count if count is None else count

        def registered() -> int:
            # the block managers the driver knows: every executor's, and the driver's own
            return int(session.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1

        wait_until(lambda: registered() >= wanted, timeout,
                   f"{wanted} executors to register with the driver on {self.master_url}", interval=0.25)
        return registered()

    # -- status ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        master = self.master_pid()
        listed: dict[str, Any] = {}
        if master is not None:
            try:
                listed = self.master_status()
            except OSError:
                listed = {}
        apps = [f"{a.get('name')} ({a.get('state')}, {a.get('cores')} cores)" for a in listed.get("activeapps", [])]
        workers = []
        for i in range(1, self.worker_count + 1):
            entry = self._listed(i) if listed else None
            workers.append({"name": f"worker-{i}", "pid": self.worker_pid(i),
                            "state": (entry or {}).get("state", "not listed"), "id": (entry or {}).get("id"),
                            "rpc": self.worker_port(i), "ui": self.worker_ui_port(i),
                            "executors": self.executor_pids(i)})
        return {"master": {"url": self.master_url, "pid": master, "ui": f"http://127.0.0.1:{self.master_ui_port}",
                           "state": listed.get("status", "down" if master is None else "not answering")},
                "workers": workers, "apps": apps, "state_dir": str(self.state_dir)}

    def status_table(self) -> str:
        status = self.status()
        m = status["master"]
        lines = [f"Spark master {m['url']}  PID {m['pid'] or '-'}  {m['state']}  UI {m['ui']}  "
                 f"(state in {status['state_dir']})", "",
                 f"{'WORKER':10} {'PID':>7}  {'STATE':10} {'RPC':>6} {'UI':>6}  {'EXECUTORS':12} ID"]
        for w in status["workers"]:
            executors = ",".join(str(p) for p in w["executors"]) or "-"
            lines.append(f"{w['name']:10} {w['pid'] or '-':>7}  {w['state']:10} {w['rpc']:>6} {w['ui']:>6}  "
                         f"{executors:12} {w['id'] or '-'}")
        lines.append("")
        lines.append("apps: " + ("; ".join(status["apps"]) or "none"))
        return "\n".join(lines)
