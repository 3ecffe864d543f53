"""The names smartclient exports, and its one exception root."""

import importlib.util

import pytest

import smartclient
import smartclient.testing

PUBLIC_MODULES = (
    "smartclient", "smartclient.testing", "smartclient.sync", "smartclient.cli", "smartclient.node_placement",
    "smartclient.amqp.placement", "smartclient.mqtt.placement", "smartclient.mqtt.fleet", "smartclient.mqtt.topics",
    "smartclient.mqtt.ingest", "smartclient.stream.codec", "smartclient.federation.apply",
    "smartclient.federation.topology", "resolvers",
) + (("smartclient.spark",) if importlib.util.find_spec("pyspark") else ())  # its names need the [spark] extra


def test_all_names_exist() -> None:
    import importlib

    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        assert module.__all__, f"{module_name} has no __all__"
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.__all__ lists missing {name}"


def test_every_exported_exception_is_under_the_one_root_and_drawn_in_the_tree() -> None:
    import importlib

    from smartclient import _errors

    exported = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                exported.add(value)
                assert issubclass(value, smartclient.SmartClientError), f"{module_name}.{name} is outside the root"
    assert len(exported) >= 20
    assert issubclass(smartclient.ConfigurationError, ValueError)
    import re

    drawn = set(re.findall(r"^\s*(?:[│ ]*[├└]── )?([A-Z]\w+)\s", _errors.__doc__ or "", re.M))
    assert set(_errors.__all__) <= drawn, f"missing from the tree in _errors: {set(_errors.__all__) - drawn}"


def test_importing_smartclient_imports_no_backend() -> None:
    import subprocess
    import sys

    code = ("import sys, smartclient, smartclient.testing; "
            "print(sorted(m for m in ('rstream','pika','paho','pyspark','dns','httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_old_import_path_is_kept() -> None:
    """No shims before 1.0 (the CHANGELOG lists what moved): an old path is an ImportError, not a warning."""
    import importlib

    for old in ("smartclient.landing", "smartclient.mqtt_placement", "smartclient.stream_pool", "smartclient.tls"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert not hasattr(__import__("smartclient"), "_moved")
