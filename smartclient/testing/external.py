"""A cluster the user already runs (docker, staging), attached through ``SMARTCLIENT_TESTBED_EXTERNAL``.

The variable holds JSON, or the path of a JSON file::

    {
      "username": "guest", "password_env": "RABBIT_PASSWORD",
      "nodes": [{"name": "rabbit@node1", "host": "10.0.0.1", "stream_port": 5552,
                 "amqp_port": 5672, "mqtt_port": 1883, "management_port": 15672,
                 "advertised_host": "node1", "advertised_port": 5552}],
      "lb": {"host": "lb.example", "stream_port": 5552, "amqp_port": 5672, "mqtt_port": 1883},
      "dns": {"host": "127.0.0.1", "port": 53}
    }

``password`` may be given inline instead of ``password_env``.  Ports default
to RabbitMQ's defaults and ``advertised_*`` to ``host``/``stream_port``.
Faults that need the machine (kill, stop_app, LB admin, DNS) are unavailable;
closing a connection through the management API works.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from smartclient._errors import ConfigurationError
from smartclient.testing.testbed import Node, TestBed

__all__ = ["ExternalTestBed"]

DEFAULT_PORTS = {"stream_port": 5552, "amqp_port": 5672, "mqtt_port": 1883, "management_port": 15672}


class ExternalTestBed(TestBed):
    kind = "external"

    def __init__(self, nodes: tuple[Node, ...], username: str, password: str,
                 lb: dict[str, Any] | None = None, dns: tuple[str, int] | None = None) -> None:
        super().__init__(nodes, username, password)
        self._lb = lb or {}
        self._dns = dns

    @classmethod
    def from_config(cls, value: str) -> ExternalTestBed:
        text = value if value.lstrip().startswith("{") else _read(value)
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"SMARTCLIENT_TESTBED_EXTERNAL is not valid JSON: {exc}") from None
        if not isinstance(raw, dict) or not raw.get("nodes"):
            raise ConfigurationError("SMARTCLIENT_TESTBED_EXTERNAL must be an object with a non-empty 'nodes' list")
        username = raw.get("username", "guest")
        if "password_env" in raw:
            password = os.environ.get(raw["password_env"])
            if password is None:
                raise ConfigurationError(
                    f"SMARTCLIENT_TESTBED_EXTERNAL names password_env {raw['password_env']!r}, which is not set"
                )
        else:
            password = raw.get("password", "guest")
        nodes = []
        for i, item in enumerate(raw["nodes"]):
            if "host" not in item:
                raise ConfigurationError(f"SMARTCLIENT_TESTBED_EXTERNAL nodes[{i}] has no 'host'")
            ports = {k: int(item.get(k, v)) for k, v in DEFAULT_PORTS.items()}
            nodes.append(Node(
                name=item.get("name", f"rabbit@{item['host']}"), host=item["host"],
                stream_port=ports["stream_port"], amqp_port=ports["amqp_port"], mqtt_port=ports["mqtt_port"],
                management_port=ports["management_port"],
                advertised_host=item.get("advertised_host", item["host"]),
                advertised_port=int(item.get("advertised_port", ports["stream_port"])),
            ))
        dns = raw.get("dns")
        return cls(tuple(nodes), username, password, lb=raw.get("lb"),
                   dns=(dns["host"], int(dns["port"])) if dns else None)

    def lb(self, protocol: str = "stream", balance: str = "roundrobin") -> tuple[str, int]:
        key = f"{protocol}_port"
        if balance != "roundrobin" or not self._lb or key not in self._lb:
            return super().lb(protocol, balance)
        return (str(self._lb["host"]), int(self._lb[key]))

    @property
    def dns_address(self) -> tuple[str, int]:
        if self._dns is None:
            return super().dns_address
        return self._dns

    def status(self) -> dict[str, Any]:
        nodes = [{
            "name": n.name, "pid": None, "state": "external", "amqp": n.amqp_port, "stream": n.stream_port,
            "mqtt": n.mqtt_port, "management": n.management_port, "advertised": f"{n.advertised_host}:"
            f"{n.advertised_port}",
        } for n in self.nodes]
        lb = [{"name": f"{p}_roundrobin", "address": f"{self._lb['host']}:{self._lb[f'{p}_port']}", "backends": {}}
              for p in ("stream", "amqp", "mqtt") if self._lb and f"{p}_port" in self._lb]
        try:
            versions = f"RabbitMQ {self.rabbitmq_version()}"
        except Exception as exc:  # the status table still shows what it can
            versions = f"RabbitMQ ? ({type(exc).__name__})"
        status: dict[str, Any] = {"kind": "external", "versions": versions, "nodes": nodes, "lb": lb}
        if self._dns:
            status["dns"] = {"address": f"{self._dns[0]}:{self._dns[1]}", "state": "external", "zone": "-",
                             "records": "?"}
        return status


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(f"SMARTCLIENT_TESTBED_EXTERNAL names {path!r}, which cannot be read: {exc}") from None
