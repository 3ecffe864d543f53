"""One RabbitMQ node of the test bed, running from the chroot: config, start, kill, ctl."""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from smartclient._errors import TestBedError
from smartclient.testing.certificates import ca_fingerprint
from smartclient.testing.chroot import RabbitChroot
from smartclient.testing.layout import BrokerSpec, Layout
from smartclient.testing.netns import listening_ports
from smartclient.testing.oauth import PUBLIC_KEY_FILE, oauth2_conf
from smartclient.testing.processes import find_pids_with_env, kill_pid, pid_alive, port_accepts, read_pid, wait_until

__all__ = ["PLUGINS", "BrokerProcess", "render_enabled_plugins", "render_rabbitmq_conf"]

log = logging.getLogger(__name__)

PLUGINS = (
    "rabbitmq_stream",
    "rabbitmq_stream_management",
    "rabbitmq_management",
    "rabbitmq_mqtt",
    "rabbitmq_federation",
    "rabbitmq_federation_management",
    # the locked bed: OAuth2 tokens as passwords, and client certificates (SASL EXTERNAL)
    "rabbitmq_auth_backend_oauth2",
    "rabbitmq_auth_mechanism_ssl",
)
COOKIE = "SMARTCLIENT-TESTBED-COOKIE"
# Idle schedulers must not spin: several nodes share two cores with the tests.
ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"


def render_rabbitmq_conf(spec: BrokerSpec, extra_lines: Sequence[str] = (), tls_dir: Path | None = None,
                         ca: str = "") -> str:
    """The node's ``rabbitmq.conf``: every listener on its address (127.0.0.1, or a namespaced node's own), on
    the ports of its slot.  A namespaced node advertises its own host name.

    With ``tls_dir`` (as seen inside the chroot) the stream, AMQP and MQTT TLS listeners are on too, and the
    locked bed's ways in: OAuth2 tokens (the internal backend first, so guest/guest still works) and client
    certificates (SASL EXTERNAL, the user being the certificate's common name; a client without a certificate
    is still let in, for the open bed).  ``ca`` (the CA's fingerprint) goes into a comment, so that a node
    restarts when its TLS material is new.  It does not set
    ``stream.advertised_tls_host``: RabbitMQ 4.0.5 (not 4.3) puts ``advertised_host`` (not the TLS host) with the
    TLS port into Metadata responses, while Open responses carry the TLS host, so setting only the TLS
    host gives one node two identities.  (See :meth:`LocalTestBed.advertise_hostnames` for the
    container case.)
    """
    tls = [
        f"# TLS material: CA {ca or '?'}",
        f"listeners.ssl.default = {spec.host}:{spec.amqp_tls_port}",
        f"stream.listeners.ssl.default = {spec.host}:{spec.stream_tls_port}",
        f"mqtt.listeners.ssl.default = {spec.host}:{spec.mqtt_tls_port}",
        f"ssl_options.cacertfile = {tls_dir}/ca.pem",
        f"ssl_options.certfile = {tls_dir}/{spec.short}.pem",
        f"ssl_options.keyfile = {tls_dir}/{spec.short}.key",
        "ssl_options.verify = verify_peer",
        "ssl_options.fail_if_no_peer_cert = false",
        "auth_mechanisms.1 = PLAIN",
        "auth_mechanisms.2 = AMQPLAIN",
        "auth_mechanisms.3 = EXTERNAL",
        "ssl_cert_login_from = common_name",
        "mqtt.ssl_cert_login = true",
        *oauth2_conf(tls_dir / PUBLIC_KEY_FILE),
    ] if tls_dir is not None else []
    lines = [
        f"listeners.tcp.default = {spec.host}:{spec.amqp_port}",
        f"stream.listeners.tcp.default = {spec.host}:{spec.stream_port}",
        f"mqtt.listeners.tcp.default = {spec.host}:{spec.mqtt_port}",
        # persistent MQTT sessions in quorum queues: a QoS 1 subscription survives the loss of its node
        "mqtt.durable_queue_type = quorum",
        # a fleet connects thousands of clients at once
        "mqtt.tcp_listen_options.backlog = 4096",
        f"management.tcp.ip = {spec.host}",
        f"management.tcp.port = {spec.management_port}",
        "loopback_users = none",
        "disk_free_limit.absolute = 50MB",
        "log.console = false",
        "log.file.level = info",
        *([f"stream.advertised_host = {spec.hostname}"] if spec.netns else []),
        *tls,
        *extra_lines,
    ]
    return "\n".join(lines) + "\n"


def render_enabled_plugins() -> str:
    return "[" + ",".join(PLUGINS) + "].\n"


class BrokerProcess:
    """Controls one node: files under ``run_dir/<short name>``, the process through its PID file."""

    def __init__(self, spec: BrokerSpec, layout: Layout, chroot: RabbitChroot) -> None:
        self.spec = spec
        self.layout = layout
        self.chroot = chroot
        self.extra_conf: list[str] = []

    # -- paths (host view and chroot view) ---------------------------------------------
    @property
    def host_dir(self) -> Path:
        return self.layout.run_dir / self.spec.short

    @property
    def inner_dir(self) -> Path:
        return self.layout.inner_base_dir / self.spec.short

    @property
    def pid_file(self) -> Path:
        return self.host_dir / "pid"

    @property
    def log_file(self) -> Path:
        return self.host_dir / "log" / f"{self.spec.name}.log"

    @property
    def fresh(self) -> bool:
        """True when the node has no data yet (never booted, or wiped)."""
        return not (self.host_dir / "mnesia").exists() or not any((self.host_dir / "mnesia").iterdir())

    def env(self) -> dict[str, str]:
        inner = self.inner_dir
        return {
            "HOME": str(self.layout.inner_base_dir),
            "ERL_EPMD_PORT": str(self.layout.epmd_port),
            "RABBITMQ_NODENAME": self.spec.name,
            "RABBITMQ_DIST_PORT": str(self.spec.dist_port),
            "RABBITMQ_CONFIG_FILE": str(inner / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(inner / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(inner / "mnesia"),
            "RABBITMQ_LOG_BASE": str(inner / "log"),
            "RABBITMQ_PID_FILE": str(inner / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ERL_ARGS,
        }

    # -- process -----------------------------------------------------------------------
    def pid(self) -> int | None:
        """The PID of the node's beam process: from its PID file, or found in /proc if that is gone.

        The beam's command line does not carry the node name (RabbitMQ names the node at
        run time), so a process is recognised by ``RABBITMQ_PID_FILE`` in its environment,
        which is unique to this node of this test bed (port base included).
        """
        identity = f"RABBITMQ_PID_FILE={self.inner_dir / 'pid'}"
        pid = read_pid(self.pid_file)
        if pid_alive(pid, must_contain="beam", env_entry=identity):
            return pid
        found = find_pids_with_env(identity, must_contain="beam")
        return found[0] if found else None

    def running(self) -> bool:
        return self.pid() is not None

    def listening(self) -> bool:
        ports = (self.spec.amqp_port, self.spec.stream_port, self.spec.mqtt_port, self.spec.management_port)
        if self.spec.netns:  # the host may not reach a namespaced node (lb-only): its namespace's table says
            return set(ports) <= listening_ports(self.spec.netns)
        return all(port_accepts(p) for p in ports)

    def listening_any(self) -> bool:
        ports = (self.spec.amqp_port, self.spec.stream_port)
        if self.spec.netns:
            return bool(set(ports) & listening_ports(self.spec.netns))
        return any(port_accepts(p, timeout=0.2) for p in ports)

    def render_conf(self) -> str:
        return render_rabbitmq_conf(self.spec, [*self.layout.release.conf, *self.extra_conf],
                                    tls_dir=self.layout.inner_base_dir / "tls",
                                    ca=ca_fingerprint(self.layout.run_dir / "tls"))

    def config_current(self) -> bool:
        """True if the node's config file and plugin list are what this version of the test bed renders (a
        running node reads both only at boot)."""
        conf, plugins = self.host_dir / "rabbitmq.conf", self.host_dir / "enabled_plugins"
        return (conf.exists() and conf.read_text() == self.render_conf()
                and plugins.exists() and plugins.read_text() == render_enabled_plugins())

    def write_files(self) -> None:
        for sub in ("mnesia", "log"):
            (self.host_dir / sub).mkdir(parents=True, exist_ok=True)
        cookie = self.layout.run_dir / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(COOKIE)
            cookie.chmod(0o400)
        (self.host_dir / "rabbitmq.conf").write_text(self.render_conf())
        (self.host_dir / "enabled_plugins").write_text(render_enabled_plugins())

    def start(self) -> None:
        """Start the node in the background (the Debian wrapper's ``-detached`` does not come up)."""
        if self.running():
            return
        self.write_files()
        self.pid_file.unlink(missing_ok=True)
        out = (self.host_dir / "log" / "console.out").open("ab")
        with out:
            subprocess.Popen(
                self.chroot.command("rabbitmq-server", [], netns=self.spec.netns),
                env=self.chroot.env(self.env()),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 90.0) -> None:
        def ready() -> bool:
            return self.running() and self.listening()

        try:
            wait_until(ready, timeout, f"{self.spec.name} to listen on all its ports", interval=0.2)
        except TestBedError as exc:
            raise TestBedError(f"{exc}; see {self.log_file} and {self.host_dir / 'log/console.out'}") from None

    def kill(self) -> int:
        """``kill -9`` the node by its PID; return that PID."""
        pid = self.pid()
        if pid is None:
            raise TestBedError(f"{self.spec.name} is not running: no live PID in {self.pid_file}")
        kill_pid(pid)
        # The thread-group leader turns zombie before the last thread has released the
        # shared file table, so the listeners can outlive the PID by a few milliseconds.
        wait_until(lambda: not self.listening_any(), 10, f"the listeners of {self.spec.name} to close")
        return pid

    def stop(self) -> None:
        """Stop gracefully, falling back to ``kill -9`` by PID."""
        pid = self.pid()
        if pid is None:
            return
        try:
            self.ctl(["stop"], timeout=60)
            wait_until(lambda: not pid_alive(pid), 30, f"{self.spec.name} to stop")
        except TestBedError:
            kill_pid(pid)

    def wipe(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.host_dir)

    # -- tools -------------------------------------------------------------------------
    def ctl(self, args: Sequence[str], timeout: float = 60.0) -> str:
        return self.tool("rabbitmqctl", args, timeout)

    def tool(self, tool: str, args: Sequence[str], timeout: float = 60.0) -> str:
        env = {"HOME": str(self.layout.inner_base_dir), "ERL_EPMD_PORT": str(self.layout.epmd_port)}
        return self.chroot.run_tool(tool, ["-n", self.spec.name, *args], env, timeout, netns=self.spec.netns).stdout
