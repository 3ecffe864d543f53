"""The map is true (issue 54): docs/architecture.md names every package and every top-level module of the library,
so a newcomer's map never misses a room."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = (ROOT / "docs" / "architecture.md").read_text()


def test_the_map_names_every_package() -> None:
    packages = sorted(str(init.parent.relative_to(ROOT)) for top in ("smartclient", "resolvers")
                      for init in (ROOT / top).rglob("__init__.py"))
    assert packages and [p for p in packages if f"`{p}/`" not in MAP] == []


def test_the_map_names_every_top_level_module_and_every_module_of_its_packages() -> None:
    missing = []
    for path in sorted((ROOT / "smartclient").rglob("*.py")) + sorted((ROOT / "resolvers").rglob("*.py")):
        package, name = str(path.parent.relative_to(ROOT)), path.name
        section = MAP.split(f"### `{package}/`", 1)
        if len(section) < 2 or f"| `{name}` |" not in section[1].split("\n### ", 1)[0]:
            missing.append(f"{package}/{name}")
    assert missing == [], f"docs/architecture.md does not name {missing}: add a row for each"
