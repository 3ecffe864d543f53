"""A small client for RabbitMQ's management HTTP API (httpx, imported lazily).

Used where a protocol does not say which node a connection landed on (AMQP
0.9.1, MQTT), for federation, and by the test bed.  The password is kept out
of ``repr`` and of every error message.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from smartclient import credentials as signing
from smartclient._errors import AuthenticationFailed, ConfigurationError, ManagementError
from smartclient.core.relogin import refusal
from smartclient.core.settings import Credentials
from smartclient.core.validation import instance, number, text, texts

if TYPE_CHECKING:
    import httpx

    from smartclient.credentials import TokenCredentials

__all__ = ["ManagementClient", "ManagementError"]


class _Bearer:
    """httpx auth: the current token of a :class:`TokenCredentials` on each request (``Authorization: Bearer``)."""

    def __init__(self, credentials: TokenCredentials) -> None:
        self.credentials = credentials

    def __call__(self, request: Any) -> Any:
        request.headers["Authorization"] = f"Bearer {self.credentials.current('the management API')}"
        return request


#: the methods whose request may be sent again when a kept-alive connection turns out closed (RFC 9110, 9.2.2)
IDEMPOTENT = ("GET", "HEAD", "PUT", "DELETE")
_SHARED_TLS: Any = None  # httpx's default verifying context, made once in a process and shared by every client


def _verify(urls: Sequence[str]) -> Any:
    """What a client's connections verify with.  Left to itself, httpx builds a context per client and loads the
    whole CA bundle into it: about 1 MB allocated in the calling thread each time, which the allocator's per-thread
    arenas keep (the soak's test bed, which opens a client per request from worker threads, grew by ~7 MB that
    way).  A client of plain http URLs needs none; clients of https ones share one."""
    global _SHARED_TLS
    if not any(url.startswith("https://") for url in urls):
        return False
    if _SHARED_TLS is None:
        import httpx

        _SHARED_TLS = httpx.create_ssl_context()
    return _SHARED_TLS


class ManagementClient:
    """Blocking client for a cluster's management API, e.g. ``http://127.0.0.1:15672``.

    Given several nodes' URLs, it asks the one that answered last, and moves to the next when a node
    cannot be reached (the connection is refused or times out before a request was sent: never after, so
    a request is never sent twice).  Any answer, an error status too, comes from the node that gave it.
    """

    def __init__(self, base_url: str | Sequence[str], username: str | None = None, password: str | None = None,
                 timeout: float = 10.0, *, credentials: TokenCredentials | None = None) -> None:
        """:param credentials: OAuth2 tokens (a locked cluster): each request carries the current one as a
            bearer token, instead of a user name and password."""
        urls = [base_url] if isinstance(base_url, str) else base_url
        texts("base_url", urls, note="the management API's http:// or https:// URL, or several nodes'")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigurationError(f"management URL {url!r} must start with http:// or https://")
        from smartclient.credentials import TokenCredentials

        instance("ManagementClient.credentials", credentials, TokenCredentials)
        if credentials is None:
            text("ManagementClient.username", username, note="or credentials=TokenCredentials(...)")
            text("ManagementClient.password", password, empty=True, secret=True)
        else:
            text("ManagementClient.username", username, empty=True, optional=True)
            text("ManagementClient.password", password, empty=True, optional=True, secret=True)
        number("ManagementClient.timeout", timeout, above=0, note="seconds")
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - depends on the extras installed
            raise ConfigurationError(
                "the management API needs httpx: pip install 'smartclient[amqp]'"
            ) from exc
        self._password = password or ""  # (for the federation's FederatedBroker; never in repr)
        self.base_urls = [url.rstrip("/") for url in urls]
        self.base_url = self.base_urls[0]  # the node asked first: the one that answered last
        self.username = username or ""
        self.tokens = credentials
        auth: Any = _Bearer(credentials) if credentials is not None else (self.username, self._password)
        self._client = httpx.Client(auth=auth, timeout=timeout, verify=_verify(self.base_urls))

    @property
    def credentials(self) -> Credentials:
        """The user and password this client signs in with (the password never appears in a repr)."""
        return Credentials(self.username, self._password)

    def __repr__(self) -> str:
        return f"ManagementClient({self.base_url!r}, username={self.username!r}, password='***')"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, within: float | None = None, **kwargs: Any) -> httpx.Response:
        import httpx

        start = self.base_urls.index(self.base_url)
        unreachable: list[str] = []
        deadline = None if within is None else time.monotonic() + within
        for base in self.base_urls[start:] + self.base_urls[:start]:
            if deadline is not None:  # the whole call within ``within`` s, over every node asked
                left = deadline - time.monotonic()
                if left <= 0:
                    unreachable.append(f"{base}: not asked: {within:g} s passed")
                    break
                kwargs["timeout"] = left
            try:
                response = self._client.request(method, base + path, **kwargs)
                if response.status_code == 401 and self._took_back(response):  # once, with the token before it
                    response = self._client.request(method, base + path, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent: try the next node
                unreachable.append(f"{base}: {type(exc).__name__}: {exc}")
                continue
            except httpx.RemoteProtocolError as exc:  # a kept-alive connection the server closed while its FIN was
                # lost (a partition healed since): sent again once, on a new connection, when asking again is harmless
                if method not in IDEMPOTENT:
                    raise ManagementError(f"{method} {base}{path} failed: {type(exc).__name__}: {exc}") from exc
                try:
                    response = self._client.request(method, base + path, **kwargs)
                except httpx.HTTPError as again:  # (a proxy in front that closes without an answer, say)
                    if method not in ("GET", "HEAD"):  # a read is asked of the next node, a write not
                        raise ManagementError(f"{method} {base}{path} failed: {type(again).__name__}: "
                                              f"{again}") from again
                    unreachable.append(f"{base}: {type(again).__name__}: {again}")
                    continue
            except httpx.ReadTimeout as exc:  # a node (or the proxy in front) went silent: a read is asked of the
                # next node, a write not
                if method not in ("GET", "HEAD"):
                    raise ManagementError(f"{method} {base}{path} failed: {type(exc).__name__}: {exc}") from exc
                unreachable.append(f"{base}: {type(exc).__name__}: {exc}")
                continue
            except httpx.HTTPError as exc:
                raise ManagementError(f"{method} {base}{path} failed: {type(exc).__name__}: {exc}") from exc
            self.base_url = base
            if response.status_code == 401:
                raise self._refused(f"{method} {base}{path} answered 401: {response.text[:300]}")
            if response.status_code >= 400:
                raise ManagementError(
                    f"{method} {base}{path} answered {response.status_code}: {response.text[:300]}",
                    status=response.status_code,
                )
            return response
        raise ManagementError(f"{method} {path} failed: no management node could be reached ("
                              + "; ".join(unreachable) + ")")

    def _took_back(self, response: httpx.Response) -> bool:
        """A 401 to a request signed with a token: the broker refused that token, which the credentials take back
        (:meth:`TokenCredentials.refused`); whether the token before it is current now (the request may go again)."""
        sent = response.request.headers.get("Authorization", "")
        return self.tokens is not None and sent.startswith("Bearer ") and signing.refused_token(
            self.tokens, sent.removeprefix("Bearer "))

    def _refused(self, text: str) -> AuthenticationFailed:
        """What a 401 means: the credentials refused, as every wing says it (a token past its expiry is
        :class:`TokenExpired`; never a :class:`ManagementError`, whose type would depend on which call came
        first)."""
        tokens = self.tokens
        if tokens is None:
            return AuthenticationFailed(f"the management API refused the credentials of {self.username!r}: {text}")
        token = tokens.token
        return refusal(AuthenticationFailed(f"the management API refused the token: {text}"), time.time(),
                       mechanism="PLAIN", provider=tokens.name, expires_at=token.expires_at if token else None)

    def get(self, path: str, within: float | None = None) -> Any:
        """GET ``path``'s JSON; ``within``: seconds the whole call may take (each node asked in turn gets what is
        left), instead of the client's ``timeout`` per node.

        :raises ManagementError: an error answer (its ``status``), or no answer (``status`` None)."""
        return self._request("GET", path, within).json()

    def put(self, path: str, body: Any) -> None:
        self._request("PUT", path, json=body)

    def post(self, path: str, body: Any) -> Any:
        """POST ``body``; the answer's JSON, if it has one (``.../get`` and ``.../publish`` do)."""
        response = self._request("POST", path, json=body)
        return response.json() if response.content else None

    def delete(self, path: str, headers: dict[str, str] | None = None) -> None:
        self._request("DELETE", path, headers=headers)

    # -- the few resources smartclient reads -------------------------------------------
    def overview(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/api/overview")
        return result

    def nodes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/nodes")
        return result

    def connections(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/connections")
        return result

    def close_connection(self, name: str, reason: str = "closed by smartclient") -> None:
        self.delete(f"/api/connections/{quote(name, safe='')}", headers={"X-Reason": reason})

    def queue(self, vhost: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}")
        return result

    def queue_node(self, vhost: str, name: str) -> str | None:
        """The node a queue lives on, read without statistics: a read with them gathers from every node, and while
        one is cut off (a partition, until its peers give it up) it waits for its timeout on each (20 s measured);
        this one answers at once.  None when the row names no node.  A node that does not know the queue (404)
        may be behind, or in a partition's minority (its metadata store misses what the majority wrote since): the
        other management nodes are asked too before the 404 is raised."""
        path = f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}?columns=node&disable_stats=true"
        try:
            row = self.get(path)
        except ManagementError as exc:
            if exc.status != 404 or len(self.base_urls) < 2:
                raise
            row = self._elsewhere(path, exc)
        node = row.get("node") if isinstance(row, dict) else None
        return str(node) if node else None

    def queue_node_bound(self, vhost: str, name: str, routing_key: str) -> str | None:
        """The node of queue ``name`` (read as :meth:`queue_node` reads it), from a management node that already
        shows the queue bound with ``routing_key``, a binding made a moment ago; None when no node shows it.  A node
        in a partition's minority answers from a metadata store the majority's writes no longer reach, where a
        queue of the same name an earlier connection left still names that connection's node: so each management
        node is asked in turn, and the first that shows the binding is asked first from then on."""
        import httpx

        path = f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}"
        for base in [self.base_url, *(b for b in self.base_urls if b != self.base_url)]:
            try:
                bound = self._client.get(f"{base}{path}/bindings")
                if bound.status_code != 200 or routing_key not in {b.get("routing_key") for b in bound.json()}:
                    continue
                row = self._client.get(f"{base}{path}?columns=node&disable_stats=true")
            except (httpx.HTTPError, ValueError, AttributeError):  # (not reached; not the JSON asked for)
                continue
            if row.status_code == 200 and isinstance(node := row.json().get("node"), str) and node:
                self.base_url = base
                return node
        return None

    def _elsewhere(self, path: str, missing: ManagementError) -> Any:
        """``GET path`` of each management node but the one that answered 404 (``missing``, raised if none has
        it): the first that has it answers, and is asked first from then on."""
        import httpx

        for base in [b for b in self.base_urls if b != self.base_url]:
            try:
                response = self._client.get(base + path)
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                self.base_url = base
                return response.json()
        raise missing
