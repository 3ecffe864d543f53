"""Refusals (issue 53), the pure parts: what a TLS alert about the client's certificate looks like in each client
library's error, and the memory that keeps smartclient's own work from dialling again with a refused login.  No
broker."""

from __future__ import annotations

import asyncio

import pytest

from smartclient import AuthenticationFailed, CertificateRejected, ConnectionFailed
from smartclient.core.relogin import certificate_alert
from smartclient.credentials import Login, RefusedLogins, acting_alone


@pytest.mark.parametrize(("text", "alert"), [
    # pika: the alert inside StreamLostError inside IncompatibleProtocolError
    ("""StreamLostError: ("Stream connection lost: SSLError(1, '[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca """
     """(_ssl.c:2580)')",)""", "alert unknown ca"),
    ("[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required", "alert certificate required"),
    ("[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate", "alert bad certificate"),
    ("127.0.0.1:20151 closed the connection before answering", None),
    ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", None),  # the server's certificate: not a refusal
])
def test_a_certificate_alert_is_found_in_every_wrapping(text: str, alert: str | None) -> None:
    assert certificate_alert(text) == alert


def test_a_refused_login_is_not_dialled_again_by_smartclient_alone_until_it_changes() -> None:
    refused = RefusedLogins()
    old, new = RefusedLogins.key(Login("PLAIN", "", "token-1")), RefusedLogins.key(Login("PLAIN", "", "token-2"))
    assert old != new and old == RefusedLogins.key(Login("PLAIN", "", "token-1"))
    error = AuthenticationFailed("the broker refused the credentials")
    refused.note(old, ConnectionFailed("reset"))  # no refusal of the login: nothing remembered
    refused.check(old)
    refused.note(old, error)
    refused.check(old)  # the application asks: it may dial

    async def recovery() -> None:
        acting_alone()
        with pytest.raises(AuthenticationFailed) as caught:
            refused.check(old)
        assert caught.value is error
        refused.check(new)  # a new token: dialled

    asyncio.run(recovery())
    refused.accepted()  # a connection logged in: nothing is held back any more

    async def later() -> None:
        acting_alone()
        refused.check(old)

    asyncio.run(later())


def test_a_rejected_certificate_is_remembered_with_its_files(tmp_path: object) -> None:
    from pathlib import Path

    from smartclient import ClientCertificate

    directory = Path(str(tmp_path))
    (directory / "c.pem").write_text("one")
    certificate = ClientCertificate(directory / "c.pem", directory / "c.pem")
    key = RefusedLogins.key(Login("EXTERNAL", "", ""), certificate)
    refused = RefusedLogins()
    refused.note(key, CertificateRejected("alert unknown ca"))

    async def recovery() -> None:
        acting_alone()
        with pytest.raises(CertificateRejected):
            refused.check(RefusedLogins.key(Login("EXTERNAL", "", ""), certificate))
        import os

        os.utime(directory / "c.pem", ns=(1, 1))  # rotated in place: another certificate
        refused.check(RefusedLogins.key(Login("EXTERNAL", "", ""), certificate))

    asyncio.run(recovery())
