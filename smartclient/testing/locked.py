"""The local bed's locked ways in: OAuth2 tokens, client certificates (SASL EXTERNAL) and SNI routes.

They are always on, beside the open bed's guest/guest and plain ports, so a test opts in only by using them
(see :mod:`smartclient.testing.oauth` for the tokens and :mod:`smartclient.testing.loadbalancer` for the SNI
frontends).  :class:`LockedLocalBed` holds them for
:class:`~smartclient.testing.local.LocalTestBed`, which gives it its layout and HAProxy; ``heal()`` restores the
SNI routes and the token authority's faults.
"""

from __future__ import annotations

import functools
from urllib.parse import quote

from smartclient.testing.certificates import ClientCertificate, current_client_certificate, issue_client_certificate
from smartclient.testing.layout import Layout
from smartclient.testing.loadbalancer import HAProxy
from smartclient.testing.oauth import TokenAuthority
from smartclient.testing.testbed import TestBed

__all__ = ["LockedLocalBed"]


class LockedLocalBed(TestBed):
    """The locked bed's part of the local test bed (its subclass sets ``layout`` and ``haproxy``)."""

    layout: Layout
    haproxy: HAProxy

    @functools.cached_property
    def tokens(self) -> TokenAuthority:
        return TokenAuthority.from_directory(self.layout.run_dir / "tls")

    def client_certificate(self, common_name: str = "smartclient-client") -> ClientCertificate:
        tls = self.layout.run_dir / "tls"
        cert = current_client_certificate(tls, common_name) or issue_client_certificate(tls, common_name)
        with self.management() as api:  # no password: it logs in by its certificate only
            api.put(f"/api/users/{quote(common_name, safe='')}", {"password_hash": "", "tags": ""})
            api.put(f"/api/permissions/%2F/{quote(common_name, safe='')}",
                    {"configure": ".*", "write": ".*", "read": ".*"})
        return cert

    def rotate_client_certificate(self, common_name: str = "smartclient-client") -> ClientCertificate:
        issue_client_certificate(self.layout.run_dir / "tls", common_name)
        return self.client_certificate(common_name)

    def sni(self, protocol: str = "stream") -> tuple[str, int]:
        return ("127.0.0.1", self.layout.sni_port(_tls(protocol)))

    def sni_route_down(self, node: str, protocol: str = "stream") -> None:
        self.haproxy.disable_sni_route(node, _tls(protocol))

    def sni_route_up(self, node: str, protocol: str = "stream") -> None:
        self.haproxy.enable_sni_route(node, _tls(protocol))

    def sni_misroute(self, node: str, to_node: str, protocol: str = "stream") -> None:
        self.haproxy.route_sni_to(node, _tls(protocol), self.layout.node(to_node).port(_tls(protocol)))

    def sni_route_restore(self, node: str, protocol: str = "stream") -> None:
        self.haproxy.route_sni_to(node, _tls(protocol), self.layout.node(node).port(_tls(protocol)))
        self.haproxy.enable_sni_route(node, _tls(protocol))

    def sni_sessions(self, protocol: str = "stream") -> dict[str, int]:
        return self.haproxy.sni_sessions(_tls(protocol))

    def _heal_locks(self) -> None:
        """Undo the locked bed's faults: every SNI route back and in service, the token authority restored."""
        self.haproxy.restore_sni_routes()
        if "tokens" in self.__dict__:  # created on first use
            self.tokens.restore()


def _tls(protocol: str) -> str:
    """``stream_tls`` for ``stream`` (or ``stream_tls``): the SNI frontends route TLS listeners only."""
    return protocol if protocol.endswith("_tls") else f"{protocol}_tls"
