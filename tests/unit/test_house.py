"""The house, checked from the source: one face over sibling wings over a pure core (docs/architecture.md).

Every import statement counts, at module level or inside a function, under ``TYPE_CHECKING`` or not: an arrow
that runs the wrong way is a wrong arrow wherever it is written.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("smartclient", "resolvers")
MAX_LINES = 600
WINGS = ("smartclient.stream", "smartclient.amqp", "smartclient.amqp10", "smartclient.mqtt", "smartclient.federation")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _sources() -> dict[str, Path]:
    return {_module(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


@cache
def _imports(module: str) -> frozenset[str]:
    """The modules (of the packages) ``module`` imports anywhere in its source."""
    path = _sources()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for name in names:
            while name and name not in _sources():
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return frozenset(found)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_circles() -> None:
    # a package's __init__ re-exports hide nothing: its own submodules' edges into it are not arrows
    graph = {m: {i for i in _imports(m) if not m.startswith(i + ".")} for m in _sources()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert circles == []


def test_no_module_over_600_lines() -> None:
    long = {m: n for m, p in _sources().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("wing", WINGS)
def test_the_wings_are_siblings(wing: str) -> None:
    """No wing imports another (the face, smartclient.environment, is the one that spans them)."""
    crossing = {(m, i) for m in _sources() if _in(m, wing) for i in _imports(m)
                if any(_in(i, other) for other in WINGS if other != wing)}
    assert crossing == set()


def test_nothing_below_imports_the_face() -> None:
    for module in _sources():
        if _in(module, "smartclient.core") or any(_in(module, wing) for wing in WINGS):
            assert "smartclient.environment" not in _imports(module), module


def test_the_core_is_pure() -> None:
    """core/ imports only core/ and the one exception tree (and the standard library)."""
    for module in _sources():
        if _in(module, "smartclient.core"):
            outside = {i for i in _imports(module) if not _in(i, "smartclient.core") and i != "smartclient._errors"}
            assert outside == set(), module


def test_spark_reaches_the_stream_wing_only_above_its_seam() -> None:
    for module in _sources():
        if _in(module, "smartclient.spark"):
            assert not any(_in(i, "smartclient.stream._rstream") for i in _imports(module)), module


def test_no_pre_1_0_shims() -> None:
    """No module of old import paths, and no ``via`` parameter anywhere in the library (CHANGELOG)."""
    assert not (ROOT / "smartclient" / "_moved.py").exists()
    with_via = []
    for module, path in _sources().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                if "via" in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}:
                    with_via.append(f"{module}.{node.name}")
    assert with_via == []


def test_a_test_helper_is_defined_once() -> None:
    """A fake, fixture or helper the tests share lives in one place (tests/unit/fakes.py, seams.py, a conftest),
    not copied into each file that needs it (issue 54 found 35 names copied 85 times)."""
    files: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) \
                    and not node.name.startswith(("test_", "Test")):
                files.setdefault(node.name, set()).add(str(path.relative_to(ROOT)))
    copied = {name: sorted(where) for name, where in files.items() if len(where) > 1}
    assert len(copied) <= 5, f"test helpers defined in more than one file (move them to a shared module): {copied}"
