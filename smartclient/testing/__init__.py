"""The smartclient test bed: a real RabbitMQ cluster (4.3 by default, or 4.0), HAProxy and a DNS server on loopback.

Drive it from a shell (``python -m smartclient.testing up|status|down``) or from
pytest, where its fixtures are opt-in: install ``smartclient[testbed]``, then
enable the plugin with ``pytest -p smartclient.testing`` (or
``-p smartclient.testing.pytest_plugin``), or in your root ``conftest.py``::

    pytest_plugins = ["smartclient.testing.pytest_plugin"]

The fixtures are ``rabbitmq_testbed``, ``rabbitmq_faulty_testbed``,
``rabbitmq_unique_name``, ``rabbitmq_tokens``, ``rabbitmq_client_certificate``
and ``rabbitmq_spark`` (see :mod:`smartclient.testing.pytest_plugin`).

Every node is also locked, for the tests that opt in: it takes OAuth2 tokens
from the bed's identity provider (``bed.tokens``), client certificates by SASL
EXTERNAL (``bed.client_certificate()``), and HAProxy routes TLS to it by SNI
(``bed.sni(protocol)``); guest/guest and the plain ports keep working.

Module map (each arrow points down, never up)::

    __init__ (from_env)  ->  local, external  ->  locked  ->  testbed (Node, TestBed)
                                                  (oauth, certificates, loadbalancer)
"""

from __future__ import annotations

import os

from smartclient.testing.layout import Layout
from smartclient.testing.testbed import Node, TestBed

__all__ = ["Layout", "Node", "TestBed", "from_env"]

# ``pytest -p smartclient.testing`` registers this package as a plugin; pytest then loads the
# fixtures from here.  A plain import of the package does nothing with it (and needs no pytest).
pytest_plugins = ["smartclient.testing.pytest_plugin"]


def from_env(environ: dict[str, str] | None = None) -> TestBed:
    """The test bed to use: an external one if ``SMARTCLIENT_TESTBED_EXTERNAL`` is set, else the local one.

    The local test bed is only described here, not started: call ``up()`` on it (the
    ``rabbitmq_testbed`` fixture does).

    :raises ConfigurationError: ``SMARTCLIENT_TESTBED_EXTERNAL`` is not a valid description.
    """
    env = dict(os.environ if environ is None else environ)
    # Imported here: the base module never imports its subclasses, and a plain
    # ``import smartclient.testing`` stays light.
    if env.get("SMARTCLIENT_TESTBED_EXTERNAL"):
        from smartclient.testing.external import ExternalTestBed

        return ExternalTestBed.from_config(env["SMARTCLIENT_TESTBED_EXTERNAL"])
    from smartclient.testing.local import LocalTestBed

    return LocalTestBed.from_env(env)
