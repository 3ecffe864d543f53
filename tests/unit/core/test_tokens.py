"""Tokens as values and their refresh schedule (pure), and TokenCredentials with a fake clock and provider."""

from __future__ import annotations

import base64
import itertools
import json
import random
import threading

import pytest

from smartclient import ClientCertificate, ConfigurationError, Token, TokenCredentials
from smartclient._errors import (
    AuthenticationFailed,
    CertificateRejected,
    ConnectionFailed,
    TokenExpired,
    TokenProviderFailed,
    TokenRefused,
)
from smartclient.core.retry import Backoff
from smartclient.core.settings import Credentials
from smartclient.core.tokens import coerce_token, jwt_expiry, refresh_delay
from smartclient.credentials import EXTERNAL, Login, after_refusal, alogin, login, refused_token, tls_context, watch
from tests.unit.fakes import Clock


def jwt(claims: dict[str, object]) -> str:
    def part(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


# -- the shapes a provider may answer -------------------------------------------------------------------------
@pytest.mark.parametrize("answer, expires", [
    (Token("secret-1", 2000.0), 2000.0),
    (("secret-1", 2000), 2000.0),
    ({"access_token": "secret-1", "expires_in": 300}, 1300.0),
    ({"access_token": "secret-1", "expires_at": 2000}, 2000.0),
    ({"access_token": jwt({"exp": 1500})}, 1500.0),
    (jwt({"exp": 1700, "sub": "svc"}), 1700.0),
])
def test_every_shape_of_answer_becomes_a_token(answer: object, expires: float) -> None:
    token = coerce_token(answer, 1000.0, "token provider p")
    assert token.expires_at == expires
    assert token.issued_at == 1000.0
    assert token.value not in repr(token) and token.value not in str(token)


@pytest.mark.parametrize("answer, why", [
    ("opaque-token", "not a JWT with an exp claim"),
    (("t", "soon"), "not a unix time"),
    ({"access_token": "", "expires_in": 5}, "no token"),
    ({"access_token": "t", "expires_in": "5"}, "not a number of seconds"),
    (None, "not a token"),
    (jwt({"sub": "no-exp"}), "not a JWT with an exp claim"),
])
def test_an_answer_that_is_no_token_is_refused_naming_the_provider(answer: object, why: str) -> None:
    with pytest.raises(TokenProviderFailed, match=f"token provider p returned .*{why}") as info:
        coerce_token(answer, 1000.0, "token provider p")
    assert info.value.provider == "token provider p"


def test_jwt_expiry_is_read_without_verifying() -> None:
    assert jwt_expiry(jwt({"exp": 123})) == 123.0
    assert jwt_expiry("a.b") is None
    assert jwt_expiry("a.!!!.c") is None


def test_the_refresh_falls_at_its_share_of_the_lifetime_spread_by_the_jitter() -> None:
    token = Token("t", 1100.0, 1000.0)
    assert refresh_delay(token, 1000.0, 0.75, 0.0) == pytest.approx(75.0)
    assert refresh_delay(token, 1050.0, 0.75, 0.0) == pytest.approx(25.0)
    rng = random.Random(7)
    delays = [refresh_delay(token, 1000.0, 0.75, 0.1, rng) for _ in range(500)]
    assert 65.0 <= min(delays) < 67.0 and 83.0 < max(delays) <= 85.0
    # never past a second before expiry, never negative
    assert refresh_delay(Token("t", 1010.0, 1000.0), 1000.0, 0.99, 0.0) == pytest.approx(9.0)
    assert refresh_delay(token, 1200.0, 0.75, 0.0) == 0.0


# -- TokenCredentials ------------------------------------------------------------------------------------------
def test_one_token_is_shared_until_its_refresh_is_due() -> None:
    clock = Clock(1000.0)
    calls: list[float] = []

    def provider() -> tuple[str, float]:
        calls.append(clock.now)
        return f"t{len(calls)}", clock.now + 100

    creds = TokenCredentials(provider, refresh_at=0.5, jitter=0.0, clock=clock)
    assert creds.current("c-1") == "t1" and creds.current("c-2") == "t1"
    clock.now = 1049.0
    assert creds.current() == "t1"
    clock.now = 1051.0
    assert creds.current() == "t2"
    assert len(calls) == 2 and creds.provider_calls == 2


def test_a_failing_provider_is_held_back_on_its_back_off_and_named() -> None:
    clock = Clock(1000.0)
    calls = 0

    def idp_down() -> str:
        nonlocal calls
        calls += 1
        raise OSError("connection refused")

    creds = TokenCredentials(idp_down, retry=Backoff(1.0, 2.0, 8.0), clock=clock, name="keycloak")
    with pytest.raises(TokenProviderFailed, match="token provider keycloak failed for connection c-1: OSError") as info:
        creds.current("c-1")
    assert info.value.provider == "keycloak" and info.value.connection == "c-1"
    for _ in range(50):  # a storm of connections asking: the provider is not asked again within the back-off
        with pytest.raises(TokenProviderFailed, match=r"not asked again before its back-off ends in 1\.0 s"):
            creds.current("c-2")
    assert calls == 1
    clock.now += 1.0
    with pytest.raises(TokenProviderFailed):
        creds.current()
    clock.now += 1.5  # the second back-off is 2 s
    with pytest.raises(TokenProviderFailed, match="not asked again"):
        creds.current()
    assert calls == 2


def test_a_valid_token_is_kept_while_the_provider_fails() -> None:
    clock = Clock(1000.0)
    answers: list[object] = [("t1", 1100.0)]

    def provider() -> object:
        answer = answers.pop(0) if answers else None
        if answer is None:
            raise RuntimeError("idp down")
        return answer

    creds = TokenCredentials(provider, refresh_at=0.5, jitter=0.0, clock=clock)
    assert creds.current() == "t1"
    clock.now = 1060.0  # due, but the provider fails: the held token is still good for 40 s
    assert creds.current() == "t1"
    clock.now = 1099.5  # within the expiry margin: no token to give
    with pytest.raises(TokenProviderFailed):
        creds.current()


def test_a_token_expired_at_connect_time_names_its_expiry() -> None:
    clock = Clock(1_764_090_000.0)
    creds = TokenCredentials(lambda: ("stale", clock.now - 30), clock=clock, name="idp")
    expired = r"idp answered a token that expired at 2025-11-25T\d\d:\d\d:\d\dZ \(30 s ago\)"
    with pytest.raises(TokenExpired, match=expired) as info:
        creds.current("c-1")
    assert info.value.expires_at == clock.now - 30 and info.value.provider == "idp"


def test_an_async_provider_is_awaited() -> None:
    import asyncio

    async def provider() -> tuple[str, float]:
        await asyncio.sleep(0)
        return "async-token", 4e9

    creds = TokenCredentials(provider)
    assert creds.current() == "async-token"
    assert asyncio.run(alogin(creds, "c")) == Login("PLAIN", "", "async-token")


def test_the_refresher_hands_every_new_token_to_every_watcher() -> None:
    issued = 0

    def provider() -> Token:
        nonlocal issued
        issued += 1
        import time
        return Token(f"t{issued}", time.time() + 2.0)  # refreshed every ~1 s

    creds = TokenCredentials(provider, refresh_at=0.5, jitter=0.05)
    seen: dict[str, list[str]] = {"a": [], "b": []}
    got_three = threading.Event()

    def on(name: str):  # type: ignore[no-untyped-def]
        def update(token: str) -> None:
            seen[name].append(token)
            if len(seen["a"]) >= 3 and len(seen["b"]) >= 3:
                got_three.set()
        return update

    creds.current()
    stop_a = watch(creds, "a", on("a"))
    stop_b = watch(creds, "b", on("b"))
    assert stop_a is not None and stop_b is not None
    assert got_three.wait(10), seen
    stop_a()
    stop_b()
    creds.close()
    assert seen["a"][:3] == seen["b"][:3]
    assert len(set(seen["a"])) == len(seen["a"])  # each token handed once


def test_static_credentials_and_external_log_in_as_they_are() -> None:
    assert login(Credentials("u", "p")) == Login("PLAIN", "u", "p")
    assert login(EXTERNAL) == Login("EXTERNAL", "", "")
    assert watch(Credentials("u", "p"), "x", print) is None
    assert "p" not in repr(Login("PLAIN", "u", "secret")).replace("PLAIN", "")


@pytest.mark.parametrize("kwargs, match", [
    ({"refresh_at": 1.5}, "refresh_at"),
    ({"refresh_at": 0.95, "jitter": 0.1}, "past the token's expiry"),
    ({"jitter": -0.1}, "jitter"),
    ({"retry": 5}, "retry"),
])
def test_bad_refresh_settings_are_refused_by_name(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        TokenCredentials(lambda: ("t", 4e9), **kwargs)  # type: ignore[arg-type]


# -- client certificates -------------------------------------------------------------------------------------
def test_a_certificate_needs_tls_and_a_provider_must_answer_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import ssl

    with pytest.raises(ConfigurationError, match="needs TLS"):
        tls_context(None, ClientCertificate("c.pem"))
    with pytest.raises(ConfigurationError, match="returned str, not a ClientCertificate"):
        tls_context(ssl.create_default_context(), lambda: "c.pem")  # type: ignore[arg-type,return-value]
    with pytest.raises(CertificateRejected, match="cannot be loaded"):
        tls_context(ssl.create_default_context(), ClientCertificate(tmp_path / "missing.pem"))


def test_a_rotated_certificate_is_loaded_once_for_the_next_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import ssl

    trustme = pytest.importorskip("trustme")  # the [testbed] extra
    ca = trustme.CA()
    paths = []
    for i in range(2):
        cert = ca.issue_cert(common_name=f"svc-{i}")
        c, k = tmp_path / f"c{i}.pem", tmp_path / f"k{i}.pem"
        cert.cert_chain_pems[0].write_to_path(str(c))
        cert.private_key_pem.write_to_path(str(k))
        paths.append(ClientCertificate(c, k))
    current = {"cert": paths[0]}
    loads = 0

    class Counting(ssl.SSLContext):
        def load_cert_chain(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
            nonlocal loads
            loads += 1
            return super().load_cert_chain(*args, **kwargs)

    context = Counting(ssl.PROTOCOL_TLS_CLIENT)
    for _ in range(3):
        assert tls_context(context, lambda: current["cert"]) is context
    assert loads == 1
    current["cert"] = paths[1]
    tls_context(context, lambda: current["cert"])
    tls_context(context, lambda: current["cert"])
    assert loads == 2


def test_a_provider_answering_expired_tokens_is_held_back_too() -> None:
    clock = Clock(1_764_090_000.0)
    calls = 0

    def stale() -> tuple[str, float]:
        nonlocal calls
        calls += 1
        return "stale", clock.now - 30

    creds = TokenCredentials(stale, retry=Backoff(1.0, 2.0, 8.0), clock=clock)
    for _ in range(100):
        with pytest.raises(TokenExpired):
            creds.current("c")
    assert calls == 1 and creds.failures == 1
    clock.now += 1.0
    with pytest.raises(TokenExpired):
        creds.current("c")
    assert calls == 2


def test_the_refresher_waits_on_the_back_off_of_a_provider_that_never_answered() -> None:
    import time

    calls = 0

    def down() -> str:
        nonlocal calls
        calls += 1
        raise OSError("down")

    creds = TokenCredentials(down, retry=Backoff(0.2, 2.0, 0.4))
    stop = creds.watch("w", lambda token: None)
    time.sleep(1.0)  # a window, not a wait: how often the refresher asks in it is the point
    stop()
    creds.close()
    assert 2 <= calls <= 5, calls  # 0.2, 0.4, 0.4 s apart: never a spin


def test_an_async_provider_is_awaited_from_a_thread_running_an_event_loop() -> None:
    import asyncio

    async def provider() -> tuple[str, float]:
        await asyncio.sleep(0)
        return "from-async", 4e9

    creds = TokenCredentials(provider)

    async def sync_placer_inside_async_code() -> str:
        return creds.current("amqp-1")  # a sync placer called inside `async with Environment`

    assert asyncio.run(sync_placer_inside_async_code()) == "from-async"


def test_a_refused_token_gives_way_to_the_one_before_it_while_that_one_is_valid() -> None:
    clock = Clock(1000.0)
    answers = itertools.chain([("good", 1100.0), ("untrusted-1", 1200.0), ("untrusted-2", 1200.0)],
                              itertools.repeat(("untrusted-1", 1200.0)))
    creds = TokenCredentials(lambda: next(answers), refresh_at=0.5, jitter=0.0, retry=Backoff(1.0, 2.0, 8.0),
                             clock=clock)
    assert creds.current() == "good"
    clock.now = 1060.0
    assert creds.current() == "untrusted-1"  # the refresh
    # the broker refuses it: every connection (a recovery's login, the management API's requests) goes on with
    # the one before it, and the provider is asked again halfway to its expiry margin (39 s left: in 19.5 s)
    assert creds.refused("untrusted-1") is True
    assert creds.current("recovery") == "good" and creds.refusals == 1
    assert creds.refused("untrusted-1") is True  # told again (another connection): the same answer
    assert creds.current() == "good" and creds.refusals == 1
    clock.now = 1079.6
    assert creds.current() == "untrusted-2"
    assert creds.refused("untrusted-2") is True and creds.current() == "good"
    # a provider that answers a refused token again fails typed, on its back-off; the valid one is kept meanwhile
    clock.now = 1090.0
    assert creds.current() == "good"
    clock.now = 1099.5  # no valid token left: the refusal, typed, and no login with a refused token
    with pytest.raises(TokenRefused, match="answered again a token the broker refused"):
        creds.current("c-9")


def test_a_refused_token_with_nothing_valid_before_it_is_a_typed_failure_on_the_back_off() -> None:
    clock = Clock(1000.0)
    calls = 0

    def provider() -> tuple[str, float]:
        nonlocal calls
        calls += 1
        return f"untrusted-{calls}", clock.now + 100

    creds = TokenCredentials(provider, retry=Backoff(1.0, 2.0, 8.0), clock=clock)
    assert creds.current() == "untrusted-1"
    assert creds.refused("untrusted-1") is False  # nothing before it
    for _ in range(20):  # a storm of logins: none with the refused token, and the provider is not asked
        with pytest.raises(TokenRefused, match="refused the token from .* no token before it is still valid"):
            creds.current()
    assert calls == 1
    clock.now += 1.0
    assert creds.current() == "untrusted-2" and calls == 2  # asked again after the back-off


def test_a_dial_refused_with_a_new_token_may_try_again_with_the_one_before_it() -> None:
    clock = Clock(1000.0)
    answers = iter([("good", 1100.0), ("untrusted", 1200.0)])
    creds = TokenCredentials(lambda: next(answers), refresh_at=0.5, jitter=0.0, clock=clock)
    assert creds.current() == "good"
    clock.now = 1060.0
    signed = login(creds)
    refused = AuthenticationFailed("refused the login")
    again = after_refusal(creds, signed, refused)
    assert type(again) is ConnectionFailed and again.__cause__ is refused and "still valid" in str(again)
    assert login(creds).password == "good"
    # the one before it refused too (or static credentials): the refusal itself
    assert after_refusal(creds, login(creds), refused) is refused
    assert after_refusal(Credentials("u", "p"), Login("PLAIN", "u", "p"), refused) is refused
    assert refused_token(Credentials("u", "p"), "p") is False
