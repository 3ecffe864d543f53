"""A login no connection has logged in with yet (a new token, a rotated certificate) is tried by one recovery's
dial first: the recoveries that begin at the same moment (the token before it expired, and ended every connection
at once) wait for the broker's answer to it, then for its verdict, instead of each presenting it.  StreamConnector
with a fake rstream client: the broker answers each connection's first request at once and judges its login after
``judge_for`` s.  No broker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from smartclient import Address, AuthenticationFailed, CertificateRejected, ConnectionFailed, Credentials
from smartclient.core.retry import RetryPolicy
from smartclient.credentials import acting_alone
from smartclient.options import ClientSettings
from smartclient.resolution import Resolution
from smartclient.stream import _rstream
from smartclient.stream.connector import StreamConnector

NODE = Address("n1", 5552)


class LoginBroker:
    """Judges each login after ``judge_for`` s: refused if its password is in ``refused``.  ``hang``: a
    connection's first request is never answered; ``unreachable``: that many connections are refused before it
    (no answer at all); ``unbuildable``: that many clients cannot be built (a certificate's files)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.refused: set[str] = set()
        self.hang = False
        self.unreachable = self.unbuildable = 0
        self.judge_for = 0.05
        self.presented: list[str] = []  # the passwords logins presented, in order
        self.judging = self.most_judged = 0  # logins being judged now, and the most at once

        broker = self

        class LoginClient:
            def __init__(self, on_answer: Any, name: str) -> None:
                self.on_answer, self._tasks = on_answer, {}
                self.server_properties = {"advertised_host": NODE.host, "advertised_port": str(NODE.port)}
                self._client_properties = {"connection_name": name}

            async def start(self) -> None:
                if broker.hang:
                    await asyncio.Event().wait()
                if broker.unreachable:
                    broker.unreachable -= 1
                    raise ConnectionFailed("connection refused")
                self.on_answer()

            async def authenticate(self, vhost: str, username: str, password: str) -> None:
                broker.presented.append(password)
                broker.judging += 1
                broker.most_judged = max(broker.most_judged, broker.judging)
                try:
                    await asyncio.sleep(broker.judge_for)
                finally:
                    broker.judging -= 1
                if password in broker.refused:
                    raise AuthenticationFailed("the broker refused the credentials")

        def new_client(cls: Any, *, name: str, on_answer: Any, **_: Any) -> LoginClient:
            if broker.unbuildable:
                broker.unbuildable -= 1
                raise CertificateRejected("the client certificate's files cannot be loaded")
            return LoginClient(on_answer, name)

        monkeypatch.setattr(_rstream, "new_client", new_client)


@pytest.fixture
def login_broker(monkeypatch: pytest.MonkeyPatch) -> LoginBroker:
    return LoginBroker(monkeypatch)


def login_connector(password: str, hedge_after: float = 0.5) -> StreamConnector:
    return StreamConnector(ClientSettings(Credentials("u", password)), Resolution(None),
                           retry=RetryPolicy(hedge_after=hedge_after))


async def recoveries(connector: StreamConnector, count: int) -> list[Any]:
    async def one(i: int) -> Any:
        acting_alone()
        return await connector._dial_once(NODE, f"recovery-{i}", None)

    return await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)


async def turns(count: int = 20) -> None:
    """Let the loop run ``count`` turns (no time passes to speak of: what waits on a timer still waits)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def first_under_way(connector: StreamConnector, older_than: float = 0.0) -> None:
    """Wait until a dial presents a new login first, and has done so for ``older_than`` s."""
    deadline = time.monotonic() + 5
    while not any(time.monotonic() - began > older_than for _, began in connector._trying.values()):
        assert time.monotonic() < deadline, "no dial presented the new login"
        await asyncio.sleep(0.005)


async def test_recoveries_at_once_with_a_new_login_the_broker_refuses_present_it_once(
        login_broker: LoginBroker) -> None:
    login_broker.refused.add("new")
    outcomes = await recoveries(login_connector("new"), 4)
    assert all(isinstance(o, AuthenticationFailed) for o in outcomes), outcomes
    assert login_broker.presented == ["new"]


async def test_a_new_login_the_broker_takes_lets_the_others_go_together(login_broker: LoginBroker) -> None:
    connector = login_connector("new")
    outcomes = await recoveries(connector, 4)
    assert [o.node for o in outcomes] == [NODE] * 4 and login_broker.presented == ["new"] * 4
    assert login_broker.most_judged == 3  # the first alone, then the three others side by side
    login_broker.most_judged = 0
    await recoveries(connector, 4)  # taken before: all four side by side
    assert login_broker.most_judged == 4


async def test_a_first_dial_left_unanswered_holds_the_others_back_only_for_hedge_after(
        login_broker: LoginBroker) -> None:
    login_broker.hang = True
    connector = login_connector("new", hedge_after=0.3)
    first = asyncio.ensure_future(recoveries(connector, 1))
    await first_under_way(connector)
    login_broker.hang = False
    others = asyncio.ensure_future(recoveries(connector, 2))
    await turns()
    assert login_broker.presented == []  # held back while the first may still be answered
    outcomes = await asyncio.wait_for(others, 5)
    assert [o.node for o in outcomes] == [NODE] * 2
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert connector._trying == {}


async def test_a_dial_beside_one_unanswered_for_hedge_after_already_goes_at_once(login_broker: LoginBroker) -> None:
    login_broker.hang, login_broker.judge_for = True, 0.0
    connector = login_connector("new", hedge_after=0.05)
    first = asyncio.ensure_future(recoveries(connector, 1))
    await first_under_way(connector, older_than=0.06)
    login_broker.hang = False
    second = asyncio.ensure_future(recoveries(connector, 1))
    await turns()
    assert login_broker.presented == ["new"] and second.done()
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_a_hedge_does_not_wait_for_the_dial_it_goes_beside(login_broker: LoginBroker) -> None:
    login_broker.hang, login_broker.judge_for = True, 0.0
    connector = login_connector("new", hedge_after=5.0)
    first = asyncio.ensure_future(recoveries(connector, 1))
    await first_under_way(connector)
    login_broker.hang = False

    async def hedge() -> Any:
        acting_alone()
        return await connector._dial_once(NODE, "hedge", None, True)

    second = asyncio.ensure_future(hedge())
    await turns()
    assert login_broker.presented == ["new"] and second.done() and second.result().node == NODE
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_a_first_dial_that_reached_no_broker_leaves_one_of_the_others_first(login_broker: LoginBroker) -> None:
    login_broker.refused.add("new")
    login_broker.unreachable = 1  # the first's node refuses the connection: the login was never judged
    outcomes = await recoveries(login_connector("new"), 4)
    assert isinstance(outcomes[0], ConnectionFailed) and not isinstance(outcomes[0], AuthenticationFailed)
    assert all(isinstance(o, AuthenticationFailed) for o in outcomes[1:]), outcomes
    assert login_broker.presented == ["new"]


async def test_a_first_dial_whose_client_could_not_be_built_lets_the_others_go(login_broker: LoginBroker) -> None:
    login_broker.unbuildable = 1
    connector = login_connector("new")
    outcomes = await asyncio.wait_for(recoveries(connector, 3), 5)
    assert isinstance(outcomes[0], CertificateRejected) and [o.node for o in outcomes[1:]] == [NODE] * 2
    assert connector._trying == {}


async def test_what_the_application_asks_for_itself_is_never_held_back(login_broker: LoginBroker) -> None:
    login_broker.refused.add("new")
    connector = login_connector("new")
    outcomes = await asyncio.gather(*(connector._dial_once(NODE, f"asked-{i}", None) for i in range(3)),
                                    return_exceptions=True)
    assert all(isinstance(o, AuthenticationFailed) for o in outcomes) and login_broker.presented == ["new"] * 3


async def test_a_recovery_waits_on_a_dial_the_application_asked_for_with_the_same_new_login(
        login_broker: LoginBroker) -> None:
    login_broker.refused.add("new")
    connector = login_connector("new")
    asked = asyncio.ensure_future(connector._dial_once(NODE, "asked", None))
    for _ in range(1000):  # (until the broker judges the asked one's login: each turn lets it go on)
        if login_broker.judging:
            break
        await asyncio.sleep(0)
    assert login_broker.presented == ["new"]
    outcomes = await recoveries(connector, 2)
    outcomes += await asyncio.gather(asked, return_exceptions=True)
    assert all(isinstance(o, AuthenticationFailed) for o in outcomes), outcomes
    assert login_broker.presented == ["new"]
