"""Missing prerequisites fail with one sentence naming the problem and the fix."""

import os
import socket
import stat
from pathlib import Path

import pytest

from smartclient import FaultUnavailable, PrerequisiteMissing
from smartclient.testing import chroot as chroot_module
from smartclient.testing.chroot import RabbitChroot, debian_mirror
from smartclient.testing.layout import Layout
from smartclient.testing.local import LocalTestBed
from smartclient.testing.prerequisites import require_java


def _bed(tmp_path: Path, base: int = 25000) -> LocalTestBed:
    return LocalTestBed(Layout(base=base, cache_dir=tmp_path))


def test_not_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PrerequisiteMissing, match="must run as root") as info:
        _bed(tmp_path).check_prerequisites()
    assert "\n" not in str(info.value)
    assert "SMARTCLIENT_TESTBED_EXTERNAL" in str(info.value)


def test_no_debootstrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real_which = chroot_module.shutil.which
    monkeypatch.setattr(chroot_module.shutil, "which", lambda t: None if t == "debootstrap" else real_which(t))
    with pytest.raises(PrerequisiteMissing, match="apt-get install -y debootstrap"):
        _bed(tmp_path).check_prerequisites()
    with pytest.raises(PrerequisiteMissing, match="debootstrap is not installed"):
        RabbitChroot(tmp_path / "root", "forky").provision()


def test_port_taken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    bed = _bed(tmp_path, base=26000)
    (tmp_path / "rabbitmq-4.3-forky").mkdir()
    (tmp_path / "rabbitmq-4.3-forky" / ".smartclient-provisioned").write_text("4.3.6")
    taken = bed.layout.nodes[1].amqp_port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", taken))
        sock.listen()
        with pytest.raises(PrerequisiteMissing) as info:
            bed.check_prerequisites()
    message = str(info.value)
    assert f"port {taken} (the amqp port of rabbit-2@localhost) is taken by pid {os.getpid()} (" in message
    assert "SMARTCLIENT_TESTBED_PORT_BASE (now 26000)" in message


def _fake_java(tmp_path: Path, version_line: str) -> None:
    script = tmp_path / "bin" / "java"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_no_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PrerequisiteMissing, match="no `java` on PATH"):
        require_java()


def test_old_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_java(tmp_path, 'openjdk version "1.8.0_392"')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(PrerequisiteMissing, match="version 8, and PySpark needs Java 17"):
        require_java()


def test_java_17_is_enough(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert require_java() == 17


def test_debian_mirror_from_deb822_and_one_line(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n")
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://other.example/debian bookworm main\n"
        "deb http://security.example/debian-security bookworm-security main\n")
    assert debian_mirror(tmp_path) == "http://other.example/debian"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert debian_mirror(empty) == "http://deb.debian.org/debian"


def test_base_test_bed_faults_are_unavailable() -> None:
    from smartclient.testing.external import ExternalTestBed

    bed = ExternalTestBed.from_config('{"nodes": [{"host": "h1"}]}')
    for fault in (lambda: bed.kill_node("h1"), bed.stop_dns, lambda: bed.disable_lb_backend("h1"),
                  lambda: bed.move_leader("s", "h1"), lambda: bed.start_brokers(2)):
        with pytest.raises(FaultUnavailable, match="the external test bed cannot"):
            fault()


def test_ports_inside_the_ephemeral_range_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    (tmp_path / "rabbitmq-4.3-forky").mkdir()
    (tmp_path / "rabbitmq-4.3-forky" / ".smartclient-provisioned").write_text("4.3.6")
    from smartclient.testing import local

    monkeypatch.setattr(local, "ephemeral_port_range", lambda: (32768, 60999))
    with pytest.raises(PrerequisiteMissing, match=r"inside the kernel's ephemeral range 32768-60999.*below 30368"):
        _bed(tmp_path, base=31000).check_prerequisites()
    assert Layout(base=20000).overlaps(32768, 60999) is False
    assert Layout(base=30500).overlaps(32768, 60999) is True


def test_down_leaves_proc_mounted_while_another_test_bed_runs_in_the_chroot(tmp_path: Path) -> None:
    """Test beds on other port bases share the cached chroot; unmounting its /proc under their nodes
    crashes their memory monitors (and with them the management API)."""
    from smartclient.testing.chroot import RabbitChroot

    root = tmp_path / "chroot"
    root.mkdir()
    proc = tmp_path / "proc"
    for pid, where in ((101, root), (102, tmp_path), (103, root)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "root").symlink_to(where)
    (proc / "self").mkdir()
    chroot = RabbitChroot.__new__(RabbitChroot)
    chroot.root = root
    assert sorted(chroot.processes_inside(proc)) == [101, 103]


def test_a_second_provisioner_waits_for_the_first_and_finds_the_chroot_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """./dev test provisions both chroots in the background while a test session may ask for the same one:
    one debootstrap runs, the other caller waits on the lock and builds nothing."""
    import threading

    started, release, builds = threading.Event(), threading.Event(), []

    def build(self: RabbitChroot) -> float:
        builds.append(self.root)
        started.set()
        assert release.wait(10)
        self.root.mkdir()
        (self.root / chroot_module.MARKER).write_text("4.3.6\n")
        return 1.0

    monkeypatch.setattr(RabbitChroot, "_build", build)
    first = RabbitChroot(tmp_path / "rabbitmq-4.3-forky", "forky")
    second = RabbitChroot(tmp_path / "rabbitmq-4.3-forky", "forky")
    took: dict[str, float] = {}
    one = threading.Thread(target=lambda: took.__setitem__("first", first.provision()))
    one.start()
    assert started.wait(10)
    two = threading.Thread(target=lambda: took.__setitem__("second", second.provision()))
    two.start()
    two.join(0.3)
    assert two.is_alive()  # waiting on the lock, not building
    release.set()
    one.join(10), two.join(10)
    assert took == {"first": 1.0, "second": 0.0} and builds == [first.root]
    assert second.rabbitmq_version() == "4.3.6"
