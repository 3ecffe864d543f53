"""Every module of ``smartclient`` and ``resolvers`` imports on this Python.

The modules are found on disk (pkgutil, nothing imported to find them) and each is imported in its own
test, so a syntax or stdlib difference on one Python names the module it breaks.  Every stage of
``./dev test`` installs every extra, so a module whose optional dependency is missing fails, naming the
dependency and its extra; so does a missing module that is no declared optional dependency.  ``__main__``
modules are not imported: importing one runs its command.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
from collections.abc import Iterator

import pytest

PACKAGES = ("smartclient", "resolvers")
# distributions whose import name is not their own name
IMPORT_NAMES = {"paho-mqtt": "paho", "dnspython": "dns", "mkdocs-material": "material"}


def _walk_without_importing(package: str) -> Iterator[str]:
    """Like :func:`pkgutil.walk_packages`, which imports each subpackage to find its children (and so would
    fail on a subpackage that needs an absent extra before any test runs); this only reads directories."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not an importable package"
    yield package
    stack = [(package, list(spec.submodule_search_locations))]
    while stack:
        name, paths = stack.pop()
        for info in pkgutil.iter_modules(paths, prefix=f"{name}."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            yield info.name
            if info.ispkg:
                stack.append((info.name, [f"{p}/{info.name.rsplit('.', 1)[-1]}" for p in paths]))


def _optional_dependencies() -> dict[str, set[str]]:
    """Top-level import name -> the extras of smartclient that bring it (from the installed metadata)."""
    try:
        requirements = importlib.metadata.requires("smartclient") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    extras: dict[str, set[str]] = {}
    for requirement in requirements:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        dist = re.match(r"[A-Za-z0-9._-]+", requirement)
        if extra and dist:
            name = dist.group(0).lower()
            import_name = IMPORT_NAMES.get(name, name.replace("-", "_").replace(".", "_"))
            extras.setdefault(import_name, set()).add(extra.group(1))
    return extras


MODULES = sorted({module for package in PACKAGES for module in _walk_without_importing(package)})


def test_the_walk_finds_the_house() -> None:
    """The walk reaches into subpackages (a broken walk would make every other test here vacuous)."""
    for expected in ("smartclient.core.topology", "smartclient.stream.wing", "resolvers.load_balancer",
                     "smartclient.testing.pytest_plugin"):
        assert expected in MODULES
    assert not [m for m in MODULES if m.endswith(".__main__")]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports(module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in PACKAGES or not missing or importlib.util.find_spec(missing) is not None:
            raise  # one of ours, or a dependency that is installed but lacks what the module needs
        extras = _optional_dependencies().get(missing)
        if not extras:
            pytest.fail(f"{module} needs {missing!r}, which is no optional dependency of smartclient: {exc}")
        pytest.fail(f"{module} needs {missing}, from the extra [{', '.join(sorted(extras))}], which every stage of "
                    f"./dev test installs: install it")
