"""The import paths of modules that moved into the house layout (``core/`` and one wing per protocol).

``import smartclient.mqtt_placement`` and the like keep working: a finder on ``sys.meta_path`` hands out the
module at its new path (the same module object, so classes compare equal) and warns once with a
``DeprecationWarning`` naming the new path.  This is the one place that knows the old names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "smartclient.address": "smartclient.core.address",
    "smartclient.topology": "smartclient.core.topology",
    "smartclient.landing": "smartclient.core.landing",
    "smartclient.retry": "smartclient.core.retry",
    "smartclient.recovery": "smartclient.core.recovery",
    "smartclient.broker_nodes": "smartclient.core.broker_nodes",
    "smartclient.routing": "smartclient.core.routing",
    "smartclient.offsets": "smartclient.core.offsets",
    "smartclient.stream_arguments": "smartclient.core.stream_arguments",
    "smartclient.filters": "smartclient.core.filters",
    "smartclient.settings": "smartclient.core.settings",
    "smartclient.redaction": "smartclient.core.redaction",
    "smartclient.deadline": "smartclient.core.deadline",
    "smartclient.environment": "smartclient.stream.environment",
    "smartclient.publishing": "smartclient.stream.publishing",
    "smartclient.super_stream": "smartclient.stream.super_stream",
    "smartclient.connector": "smartclient.stream.connector",
    "smartclient.stream_stats": "smartclient.stream.stats",
    "smartclient.message_codec": "smartclient.stream.codec",
    "smartclient.stream_pool": "smartclient.stream._rstream",
    "smartclient.stream_errors": "smartclient.stream._rstream",
    "smartclient.stream.errors": "smartclient.stream._rstream",
    "smartclient.tls": "smartclient.core.tls_names",
    "smartclient.stream.tls": "smartclient.core.tls_names",
    "smartclient.amqp_placement": "smartclient.amqp.placement",
    "smartclient.amqp_streams": "smartclient.amqp.streams",
    "smartclient.rpc": "smartclient.amqp.rpc",
    "smartclient.mqtt_placement": "smartclient.mqtt.placement",
    "smartclient.mqtt_fleet": "smartclient.mqtt.fleet",
    "smartclient.mqtt_topics": "smartclient.mqtt.topics",
    "smartclient.mqtt_ingest": "smartclient.mqtt.ingest",
    "smartclient.federation_topology": "smartclient.federation.topology",
}
"""Old module path -> new one.  (``smartclient.stream`` and ``smartclient.federation`` are packages now and
export what their old modules did.)"""


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.target}; import it from there", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system set the alias's spec on the shared module


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
