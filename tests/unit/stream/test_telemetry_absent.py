"""Without OpenTelemetry, smartclient imports, makes Environments, and records nothing (issue 19)."""

from __future__ import annotations

import sys

import pytest

from smartclient import _otel


def test_without_opentelemetry_there_is_no_meter_and_no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # "not installed": its import raises ImportError
    assert _otel.meter() is None
    from smartclient import Environment

    env = Environment("rabbitmq-stream://guest:guest@localhost:5552/")  # no I/O before it is entered
    assert env.streams._carriers.telemetry is None


def test_every_instrument_has_a_known_kind_a_unit_and_a_description() -> None:
    for name, (kind, unit, description) in _otel.INSTRUMENTS.items():
        assert kind in {"counter", "sum", "gauge", "count", "histogram"}, name
        assert unit and description, name


def test_confirm_timing_only_with_a_provider_given_or_set() -> None:
    """What costs a little per Publish frame is done only when metrics go somewhere."""
    pytest.importorskip("opentelemetry.metrics")
    assert _otel.configured(object()) is True
    assert _otel.configured() is False  # the API's default proxy: nobody set a global provider in the tests
