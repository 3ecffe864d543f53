"""smartclient reaches into pyspark in one module, ``smartclient/spark/_pyspark.py``.

These tests are generated from that module's lists (``PYSPARK_INTERNALS``, ``PYSPARK_NAMES``, ``PYSPARK_SIGNATURES``,
``PYSPARK_READ_LIMITS``): every entry is checked against the installed pyspark, the lists are checked to cover every
private name the seam touches, and the library is grepped for pyspark imports and those private names outside the
seam (the test bed, ``smartclient/testing/``, starts Spark itself and keeps its own imports).  They fail loudly
when a new pyspark moves the seam; ``pyproject.toml`` pins pyspark>=4.0.1,<4.4 and, for the ``[spark]`` extra,
pandas below 3, which PySpark 4.3 warns about.  The Scala methods the seam calls through py4j
(``SPARK_JVM_CALLS``) need a JVM: tests/integration/test_spark_shuffle_free.py runs them.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import warnings

import pytest

from smartclient.spark._pyspark import (
    PYSPARK_INTERNALS,
    PYSPARK_NAMES,
    PYSPARK_READ_LIMITS,
    PYSPARK_SIGNATURES,
    read_limits,
)
from tests.unit.seams import ROOT, imports_of, parameters, private_names_used_in, private_uses, resolve_path

SEAM = ROOT / "smartclient" / "spark" / "_pyspark.py"
TESTBED = "smartclient/testing/"


# -- the lists, entry by entry -------------------------------------------------------------------------
@pytest.mark.parametrize("entry", PYSPARK_INTERNALS)
def test_every_private_name_of_pyspark_the_seam_relies_on_exists(entry: str) -> None:
    owner, _, name = entry.rpartition(".")
    cls = resolve_path(owner)
    if any(name in vars(k) for k in cls.__mro__):
        return
    # an instance attribute: set by the constructor
    assert re.search(rf"self\.{name}\b[^=]*=", inspect.getsource(cls.__init__)), \
        f"pyspark's {owner}.__init__ no longer sets {name}"


@pytest.mark.parametrize("path", PYSPARK_NAMES)
def test_every_public_name_the_spark_helpers_use_exists(path: str) -> None:
    assert resolve_path(path) is not None


@pytest.mark.parametrize("entry", sorted(PYSPARK_SIGNATURES))
def test_every_signature_the_spark_helpers_rely_on(entry: str) -> None:
    fn = resolve_path(entry)
    missing = set(PYSPARK_SIGNATURES[entry]) - set(parameters(fn))
    assert not missing, f"pyspark's {entry}{inspect.signature(fn)} lost {sorted(missing)}"


def test_the_read_limits_are_there_from_pyspark_4_2_and_absent_before() -> None:
    import pyspark

    limits = read_limits()
    major, minor = (int(part) for part in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):  # no admission control for Python sources: the seam says so, it does not fail
        assert limits is None
        return
    assert limits is not None
    missing = [name for name in PYSPARK_READ_LIMITS if not hasattr(limits, name)]
    assert not missing, f"pyspark.sql.streaming.datasource lacks {missing}"


def test_the_arrow_writers_are_used_where_this_pyspark_has_them_and_the_row_writers_else() -> None:
    from pyspark.sql import datasource

    from smartclient.spark import _pyspark

    present = all(hasattr(datasource, name) for name in _pyspark.PYSPARK_ARROW_WRITERS)
    assert _pyspark.ARROW_WRITERS is present
    assert _pyspark.DataSourceArrowWriter is getattr(datasource, "DataSourceArrowWriter", datasource.DataSourceWriter)
    major, minor = (int(part) for part in _pyspark.PYSPARK_VERSION.split(".")[:2])
    if (major, minor) >= (4, 3):
        assert present  # what the tests here run on: the Arrow path


def test_row_writers_rows_become_arrow_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import Row

    from smartclient.spark import _pyspark

    monkeypatch.setattr(_pyspark, "ARROW_WRITERS", False)
    batches = list(_pyspark.arrow_batches(iter([Row(id=i, body=b"x") for i in range(5)]), rows_per_batch=2))
    assert [b.num_rows for b in batches] == [2, 2, 1] and batches[0].column_names == ["id", "body"]


def test_the_lists_name_every_private_pyspark_name_the_seam_touches() -> None:
    listed = {entry.rpartition(".")[2] for entry in PYSPARK_INTERNALS}
    touched = private_names_used_in(SEAM)
    assert touched <= listed, f"the seam touches pyspark's {sorted(touched - listed)}: add them to PYSPARK_INTERNALS"


# -- nobody else reaches into pyspark -------------------------------------------------------------------------
def test_only_the_seam_imports_pyspark() -> None:
    outside = [hit for hit in imports_of("pyspark", SEAM) if not hit.startswith(TESTBED)]
    assert outside == [], f"only smartclient/spark/_pyspark.py imports pyspark: {outside}"


def test_no_other_module_of_the_spark_helpers_names_pyspark_in_code() -> None:
    """A plain grep of smartclient/spark, past the AST: any ``pyspark.`` or ``"pyspark`` outside docstrings and
    comments (an ``importlib`` or ``__import__`` of it under another spelling, say)."""
    found = []
    for path in sorted((ROOT / "smartclient" / "spark").rglob("*.py")):
        if path == SEAM:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"""(\bimport\s+pyspark\b|\bfrom\s+pyspark\b|["']pyspark\b)""", code):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_only_the_seam_touches_pysparks_private_names() -> None:
    names = {entry.rpartition(".")[2] for entry in PYSPARK_INTERNALS}
    assert private_uses(names, SEAM, set()) == []


def test_the_spark_helpers_import_no_pyspark_until_used() -> None:
    """The [spark] extra stays lazy: ``smartclient.spark`` and its sink, session and runtime import no pyspark
    (nor pandas) until a function needs it."""
    code = ("import sys, smartclient, smartclient.spark, smartclient.spark.sink, smartclient.spark.session, "
            "smartclient.spark.runtime; print(sorted(m for m in ('pyspark', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


# -- pandas: what the [spark] extra installs, PySpark does not warn about ---------------------------------
def test_the_installed_pandas_is_one_pyspark_supports_without_a_warning() -> None:
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PySpark 4.3: FutureWarning "does not yet fully support pandas >= 3.0.0"
        require_minimum_pandas_version()


def test_the_spark_extra_pins_pandas_below_3() -> None:
    """As installed (./dev reinstalls when pyproject.toml changes): the [spark] extra's pandas requirement."""
    import importlib.metadata

    requirements = importlib.metadata.requires("smartclient") or []
    [pandas] = [r for r in requirements if re.match(r"pandas\b", r) and re.search(r"""extra\s*==\s*["']spark""", r)]
    assert re.search(r"<\s*3(\.0)*\s*[,;]", pandas), f"the [spark] extra needs pandas<3 (PySpark 4.3 warns): {pandas}"
