"""What every seam test checks, for a seam module over a library we build on (smartclient/mqtt/_paho.py,
smartclient/amqp/_pika.py, smartclient/spark/_pyspark.py): the names on its lists resolve in the installed library,
their signatures hold, and no other module imports that library or touches its private names."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = (ROOT / "smartclient", ROOT / "resolvers")


def library_files() -> list[Path]:
    return sorted(p for top in LIBRARY for p in top.rglob("*.py"))


def resolve_path(dotted: str, base: Any = None) -> Any:
    """The object at ``dotted``: a full module path (``paho.mqtt.enums.X``), or relative to ``base``."""
    if base is not None:
        obj = base
        for part in dotted.split("."):
            obj = getattr(obj, part)
        return obj
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def imports_of(package: str, skip: Path) -> list[str]:
    """``file:line`` of every import of ``package`` (TYPE_CHECKING and function-level ones too) in the
    library, outside ``skip``."""
    found = []
    pattern = re.compile(r"""import_module\(\s*['"]""" + re.escape(package) + r"""\b""")
    for path in library_files():
        if path == skip:
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n == package or n.startswith(package + ".") for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
    return found


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def classes_built_on(roots: set[str]) -> set[str]:
    """Names of the library's classes that derive, directly or not, from a class named in ``roots``."""
    derived = set(roots)
    trees = [ast.parse(path.read_text()) for path in library_files()]
    classes = [(n.name, {_base_name(b) for b in n.bases})
               for tree in trees for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    while True:
        more = {name for name, bases in classes if bases & derived} - derived
        if not more:
            return derived
        derived |= more


def private_uses(names: set[str], skip: Path, client_classes: set[str]) -> list[str]:
    """``file:line: expression`` for every use of one of the private ``names`` outside ``skip``: on any object
    (``client._sock``, ``getattr(c, "_sock")``), except a class's own attributes (``self._x``) in classes not
    built on ``client_classes``."""
    derived = classes_built_on(client_classes) if client_classes else set()
    found: list[str] = []

    class Visitor(ast.NodeVisitor):
        def __init__(self, path: Path) -> None:
            self.path = path
            self.classes: list[str] = []

        def visit_ClassDef(self, node: ast.ClassDef) -> None:
            self.classes.append(node.name)
            self.generic_visit(node)
            self.classes.pop()

        def report(self, node: ast.AST) -> None:
            found.append(f"{self.path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")  # type: ignore[attr-defined]

        def visit_Attribute(self, node: ast.Attribute) -> None:
            if node.attr in names:
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not own or (self.classes and self.classes[-1] in derived):
                    self.report(node)
            self.generic_visit(node)

        def visit_Call(self, node: ast.Call) -> None:
            if (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
                self.report(node)
            self.generic_visit(node)

    for path in library_files():
        if path != skip:
            Visitor(path).visit(ast.parse(path.read_text()))
    return found


def private_names_used_in(path: Path) -> set[str]:
    """Every ``_name`` (not dunder) the module at ``path`` reads or writes as an attribute."""
    return {n.attr for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")}


def parameters(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)

