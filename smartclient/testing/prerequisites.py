"""Checks for what parts of the test bed need beyond the broker (Java for Spark)."""

from __future__ import annotations

import re
import shutil
import subprocess

from smartclient._errors import PrerequisiteMissing

__all__ = ["require_java"]


def require_java(min_major: int = 17) -> int:
    """Return the major version of ``java`` on PATH, or raise one sentence saying what to install."""
    java = shutil.which("java")
    if java is None:
        raise PrerequisiteMissing(
            f"no `java` on PATH, and PySpark needs Java {min_major}+: install openjdk-{min_major}-jre-headless"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0" style
        major = int(match.group(2))
    if major < min_major:
        raise PrerequisiteMissing(f"java on PATH is version {major or '?'}, and PySpark needs Java {min_major}+")
    return major
