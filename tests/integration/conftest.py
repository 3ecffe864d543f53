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


@pytest.fixture
def open_stream_client(testbed: TestBed) -> Callable[..., Any]:
    def opener(host: str, port: int, name: str = "") -> Any:
        return raw_stream_client(testbed, host, port, name)

    return opener
