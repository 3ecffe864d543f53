"""Without pyarrow the library imports and reads as before; only Arrow reads refuse, naming the extra."""

from __future__ import annotations

import sys

import pytest

from smartclient import ConfigurationError


def test_arrow_reads_without_pyarrow_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from smartclient import _pyarrow

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # (an import of it raises ImportError)
    _pyarrow.arrow.cache_clear()
    try:
        with pytest.raises(ConfigurationError, match=r"pyarrow is missing.*smartclient\[arrow\]"):
            _pyarrow.arrow()
    finally:
        _pyarrow.arrow.cache_clear()


def test_importing_the_library_imports_no_pyarrow() -> None:
    import subprocess

    code = ("import sys, smartclient, smartclient.stream, smartclient.stream._rstream.columns, smartclient.environment;"
            "print('pyarrow' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
