"""The one exception tree of smartclient.

Every error smartclient raises derives from :class:`SmartClientError`, so a
service can catch the whole library with one ``except``.  Errors of the
packages underneath (rstream, pika, paho-mqtt, dnspython, httpx) are mapped
onto this tree in one place per backend, with ``raise ... from exc``.

    SmartClientError
    ├── ConfigurationError          bad input, found before any I/O (also a ValueError)
    └── TestBedError                the local test bed could not do what was asked
        ├── PrerequisiteMissing     not root, no debootstrap, port taken, no Java...
        └── FaultUnavailable        this test bed (e.g. an external one) cannot inject that fault
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "FaultUnavailable",
    "PrerequisiteMissing",
    "SmartClientError",
    "TestBedError",
]


class SmartClientError(Exception):
    """Root of every error smartclient raises."""


class ConfigurationError(SmartClientError, ValueError):
    """A value given to smartclient is malformed or out of range; nothing was sent."""


class TestBedError(SmartClientError):
    """The test bed could not be set up, queried or faulted as asked."""

    __test__ = False  # not a pytest test class, whatever its name says


class PrerequisiteMissing(TestBedError):
    """Something the test bed needs is not on this machine; the message says what and how to fix it."""


class FaultUnavailable(TestBedError):
    """This test bed cannot inject the requested fault (for example an external cluster)."""
