"""The package as a user gets it: ``python -m build`` makes a wheel and an sdist, the wheel installs with only
the ``[stream]`` extra into a fresh virtualenv, and the quickstart runs from that install against the test bed.

It builds the working tree as it is (sdist first, then the wheel from the sdist, as ``build`` does by
default) and reuses pip's cache, so a warm run takes well under a minute.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from smartclient.testing import TestBed

ROOT = Path(__file__).resolve().parents[2]
# what setuptools says about a license it finds deprecated (the old table form, or a "License ::" classifier)
LICENSE_WARNING = re.compile(r"SetuptoolsDeprecationWarning|license[^\n]*(deprecat|supersed)", re.IGNORECASE)


def _run(args: list[str | Path], *, timeout: float, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, args))} exited {proc.returncode}:\n{output[-4000:]}"
    return output


def test_the_wheel_installs_with_the_stream_extra_and_runs_the_quickstart(rabbitmq_testbed: TestBed,
                                                                         tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_PROGRESS_BAR="off")
    dist = tmp_path / "dist"

    built = _run([sys.executable, "-m", "build", "--outdir", dist, ROOT], timeout=300, cwd=tmp_path, env=env)
    assert not LICENSE_WARNING.search(built), built
    wheels, sdists = sorted(dist.glob("smartclient-*.whl")), sorted(dist.glob("smartclient-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    wheel = wheels[0]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "smartclient/py.typed" in names and "resolvers/py.typed" in names
    assert "resolvers/__init__.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    assert "License-Expression: Apache-2.0" in metadata
    with tarfile.open(sdists[0]) as tf:
        assert any(n.endswith("/smartclient/py.typed") for n in tf.getnames())

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=120, cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    installed = _run([python, "-m", "pip", "install", f"{wheel}[stream]"], timeout=300, cwd=tmp_path, env=env)
    assert not LICENSE_WARNING.search(installed), installed

    # the install, not the source tree, is what imports; and it holds the stream extra only
    where = _run([python, "-c", "import importlib.util, smartclient, resolvers; "
                  "print(smartclient.__file__, resolvers.__file__, importlib.util.find_spec('pika'))"],
                 timeout=60, cwd=tmp_path, env=env).split()
    assert all(path.startswith(str(venv)) for path in where[:2]), where
    assert where[2] == "None", "pika is installed: the wheel's [stream] extra pulled in more than rstream"

    host, port = rabbitmq_testbed.lb("stream")
    env["SMARTCLIENT_URI"] = rabbitmq_testbed.stream_uri(host, port)
    out = _run([python, ROOT / "examples" / "quickstart.py"], timeout=120, cwd=tmp_path, env=env)
    assert "placement OK" in out, out
