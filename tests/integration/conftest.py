"""Shared helpers for tests against the real test bed (fixtures come from smartclient.testing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from smartclient.testing import TestBed
from smartclient.testing.streams import raw_stream_client

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as a module, to drive its functions from a test."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def open_stream_client(rabbitmq_testbed: TestBed) -> Callable[..., Any]:
    def opener(host: str, port: int, name: str = "") -> Any:
        return raw_stream_client(rabbitmq_testbed, host, port, name)

    return opener
