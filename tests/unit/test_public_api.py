"""The names smartclient exports, and its one exception root."""

import smartclient
import smartclient.testing

PUBLIC_MODULES = (
    "smartclient", "smartclient.testing", "smartclient.sync", "smartclient.cli", "smartclient.node_placement",
    "smartclient.amqp_placement", "smartclient.mqtt_placement", "smartclient.mqtt_fleet", "smartclient.mqtt_topics",
    "smartclient.mqtt_ingest", "smartclient.message_codec", "smartclient.federation",
    "smartclient.federation_topology", "smartclient.spark", "resolvers",
)


def test_all_names_exist() -> None:
    import importlib

    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        assert module.__all__, f"{module_name} has no __all__"
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.__all__ lists missing {name}"


def test_every_error_derives_from_the_root() -> None:
    errors = [getattr(smartclient, n) for n in smartclient.__all__ if n.endswith(("Error", "Missing", "Unavailable"))]
    assert errors
    for error in errors:
        assert issubclass(error, smartclient.SmartClientError)
    assert issubclass(smartclient.ConfigurationError, ValueError)


def test_importing_smartclient_imports_no_backend() -> None:
    import subprocess
    import sys

    code = ("import sys, smartclient, smartclient.testing; "
            "print(sorted(m for m in ('rstream','pika','paho','pyspark','dns','httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
