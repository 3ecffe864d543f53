"""A new token reaches each live AMQP 1.0 connection on the thread that drives it, never from two threads at once:
at once when idle and ready, after the current step when busy, on its own thread (woken) for a consumer, and not
before its owner has attached its link.  No broker: the request itself is replaced."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("rabbitmq_amqp_python_client", reason="the [amqp10] extra is not installed")

from smartclient import Address, ConnectionFailed, TokenRefused
from smartclient.amqp10 import clients
from smartclient.amqp10.clients import PlacedAmqp10Connection


class Sent:
    """The replaced ``refresh_token``: which thread sent which token, and what it raises next."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.raises: Exception | None = None

    def __call__(self, connection: Any, token: str, where: str, wait: float) -> None:
        self.calls.append((threading.current_thread().name, token))
        if self.raises is not None:
            raise self.raises


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    replaced = Sent()
    monkeypatch.setattr(clients, "refresh_token", replaced)
    return replaced


def placed_connection(ready: bool = True) -> PlacedAmqp10Connection:
    return PlacedAmqp10Connection(object(), "rabbit@a", Address("a", 5672), "c-1", ready=ready)  # type: ignore[arg-type]


def offered(connection: PlacedAmqp10Connection, token: str) -> None:
    thread = threading.Thread(target=connection.offer_token, args=(token,), name="refresher")
    thread.start()
    thread.join(5)


def test_an_idle_ready_connection_takes_it_at_once_and_one_not_ready_waits_for_its_owner(sent: Sent) -> None:
    idle = placed_connection()
    offered(idle, "t1")
    assert sent.calls == [("refresher", "t1")] and idle.token_updates == 1 and idle.pending_token is None
    attaching = placed_connection(ready=False)  # its owner is attaching its link on another thread: left for it
    offered(attaching, "t2")
    assert len(sent.calls) == 1 and attaching.pending_token == "t2"
    with attaching.driving():  # the owner's next step sends it, on the owner's thread
        pass
    assert sent.calls[-1] == (threading.current_thread().name, "t2") and attaching.token_updates == 1


def test_a_busy_connection_takes_it_on_the_thread_that_drives_it_after_its_step(sent: Sent) -> None:
    busy = placed_connection()
    with busy.driving():
        offered(busy, "t1")  # the refresher cannot have it now
        assert sent.calls == [] and busy.pending_token == "t1"
    assert sent.calls == [(threading.current_thread().name, "t1")]


def test_a_consumer_is_woken_and_takes_it_on_its_own_thread(sent: Sent) -> None:
    consumer = placed_connection()
    woken = threading.Event()
    consumer.wake = woken.set
    offered(consumer, "t1")
    assert woken.is_set() and sent.calls == [] and consumer.pending_token == "t1"
    consumer.take_token()  # what its loop does between two passes
    assert sent.calls == [(threading.current_thread().name, "t1")]


def test_a_refusal_is_kept_and_a_silent_connection_is_closed_for_its_owner_to_recover(sent: Sent) -> None:
    refused = placed_connection()
    sent.raises = TokenRefused("no", connection="c-1")
    offered(refused, "t1")
    assert isinstance(refused.token_failure, TokenRefused) and not refused.closed and refused.token_updates == 0
    silent = placed_connection()
    sent.raises = ConnectionFailed("renewing the token of c-1: timed out")
    offered(silent, "t2")
    assert silent.closed  # its reply could come later and be taken for another request's
    with pytest.raises(ConnectionFailed):  # on its owner's thread, the loss is the owner's to recover
        refused.pending_token = "t3"
        refused.take_token()


def test_a_close_asked_while_another_thread_drives_it_is_done_by_that_thread(sent: Sent) -> None:
    connection = placed_connection()
    with connection.driving():
        closer = threading.Thread(target=connection.close, kwargs={"wait": False})
        closer.start()
        closer.join(5)
        assert not connection.closed and connection.close_pending
    assert connection.closed
