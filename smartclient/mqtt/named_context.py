"""The ``SSLContext`` the MQTT seam gives paho, so that TLS verifies the name smartclient chose (see
:mod:`smartclient.mqtt._paho`: paho wraps each socket with ``server_hostname=self._host``, the address dialled)."""

from __future__ import annotations

import ssl
from typing import Any

from smartclient._errors import ConfigurationError


class NamedContext:
    """An ``SSLContext`` stand-in that makes paho verify ``server_name`` instead of the dialled host.

    :raises ConfigurationError: the context does not verify certificates and host names (smartclient does
        not turn TLS verification off).
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        if context.verify_mode is ssl.CERT_NONE or not context.check_hostname:
            raise ConfigurationError("smartclient does not turn TLS verification off: give a verifying SSLContext")
        self.context = context
        self.check_hostname = True  # paho then leaves the host name check to wrap_socket
        self.server_name = ""

    def wrap_socket(self, sock: Any, server_hostname: str | None = None, **kwargs: Any) -> ssl.SSLSocket:
        return self.context.wrap_socket(sock, server_hostname=self.server_name or server_hostname, **kwargs)
