"""The docs show the real API: every ``smartclient`` command line in README.md and docs/*.md parses with the
real CLI, and docs/testbed.md calls the test bed's methods as they are, and lists every fault."""

from __future__ import annotations

import ast
import inspect
import re
import shlex
from pathlib import Path

import pytest

from smartclient.testing.local import LocalTestBed
from smartclient.testing.testbed import TestBed

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def command_lines() -> list[tuple[str, str]]:
    """``smartclient ...`` lines of the docs and of the CLI's docstring, as (where, line)."""
    from smartclient import cli

    found = []
    for where, text in [(p.name, p.read_text()) for p in DOCS] + [("smartclient/cli.py", cli.__doc__ or "")]:
        for line in text.splitlines():
            match = re.match(r"^\s*(?:\$ )?smartclient (topology|probe|place|bench)\b(.*)$", line)
            if match:
                found.append((where, f"{match.group(1)}{match.group(2).split('#')[0]}".strip()))
    return found


@pytest.mark.parametrize("where, line", command_lines())
def test_every_cli_example_in_the_docs_parses(where: str, line: str) -> None:
    from smartclient.cli import _parser

    _parser().parse_args(shlex.split(line))  # argparse exits (SystemExit) on an option it does not know


def test_the_docs_show_the_commands_they_describe() -> None:
    assert {line.split()[0] for _, line in command_lines()} == {"topology", "probe", "place", "bench"}


def test_without_a_uri_via_or_lb_is_the_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from smartclient.cli import DEFAULT_URI, _entry_uri, _parser

    for name in ("SMARTCLIENT_URI", "SMARTCLIENT_LB"):
        monkeypatch.delenv(name, raising=False)

    def uri(*argv: str) -> str:
        return _entry_uri(_parser().parse_args(list(argv)))

    assert uri("probe", "--via", "my-lb:5553") == "rabbitmq-stream://guest:guest@my-lb:5553/"
    assert uri("probe", "--via", "my-lb") == "rabbitmq-stream://guest:guest@my-lb:5552/"
    assert uri("topology", "s", "--lb", "127.0.0.1:20052") == "rabbitmq-stream://guest:guest@127.0.0.1:20052/"
    assert uri("place", "s") == DEFAULT_URI
    given = "rabbitmq-stream://app:secret@entry:5552/prod"
    assert uri("probe", "--via", "my-lb:5552", "--uri", given) == given  # its credentials; probe dials --via
    monkeypatch.setenv("SMARTCLIENT_URI", given)
    assert uri("probe", "--via", "my-lb:5552") == given


def _testbed_calls() -> list[ast.Call]:
    text = (ROOT / "docs" / "testbed.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/testbed.md has no python example"
    calls = []
    for block in blocks:
        tree = ast.parse(block)  # each example is valid Python
        calls += [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in ("rabbitmq_testbed", "rabbitmq_faulty_testbed")]
    return calls


def test_testbed_examples_call_the_real_methods_with_their_real_parameters() -> None:
    called = set()
    for call in _testbed_calls():
        name = call.func.attr  # type: ignore[attr-defined]
        method = getattr(LocalTestBed, name, None)
        assert callable(method), f"docs/testbed.md calls testbed.{name}, which does not exist"
        args = [None] * len([a for a in call.args if not isinstance(a, ast.Starred)])
        kwargs = {k.arg: None for k in call.keywords if k.arg}
        signature = inspect.signature(method)
        starred = len(args) < len(call.args) or len(kwargs) < len(call.keywords)
        bind = signature.bind_partial if starred else signature.bind  # *args: their count is unknown here
        bind(None, *args, **kwargs)  # TypeError if the call does not fit
        called.add(name)
    assert {"lb", "advertise_hostnames", "shutdown_lb_sessions", "restart_lb"} <= called


def test_testbed_docs_list_every_fault() -> None:
    """Every fault of the test bed (a method the base class refuses with FaultUnavailable) is documented."""
    text = (ROOT / "docs" / "testbed.md").read_text()
    faults = [name for name, member in inspect.getmembers(TestBed, inspect.isfunction)
              if "self._unavailable(" in inspect.getsource(member)]
    assert {"advertise_hostnames", "shutdown_lb_sessions", "restart_lb", "kill_node"} <= set(faults)
    missing = [name for name in faults if f"`{name}(" not in text and f"/ `{name}`" not in text]
    assert not missing, f"docs/testbed.md does not document {missing}"
    for balance in ("source", "random", "random1"):
        assert f'testbed.lb("stream", "{balance}")' in text or f'"{balance}")' in text, balance
