"""The smartclient test bed: a real RabbitMQ 4.0 cluster, HAProxy and a DNS server on loopback.

Use it from pytest (the fixtures ``testbed``, ``faulty_testbed`` and
``unique_name`` come with ``pip install 'smartclient[testbed]'``), or from a
shell: ``python -m smartclient.testing up|status|down``.
"""

from __future__ import annotations

from smartclient.testing.layout import Layout
from smartclient.testing.testbed import Node, TestBed, from_env

__all__ = ["Layout", "Node", "TestBed", "from_env"]
