"""The two HTTP calls a client makes, with failover across nodes (stdlib only).

``lease`` asks ``POST /lease/{tag}?count=N`` and answers the leased ranges;
``give_back`` sends ``POST /lease/return`` with the lease's secret. Both send
the tag's token (``Authorization: Bearer``) when one is configured for it. A
connection error, a timeout or a 5xx moves on to the next URL; a 4xx is the
node's verdict and is raised at once (401/403 as ``IdPoolAuthError``).
Blocking: the sync client calls these from its fetch threads, the async client
through ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, urlsplit

from .errors import (
    IdPoolAuthError,
    IdPoolError,
    IdPoolRequestError,
    IdPoolUnavailable,
    request_error,
)
from .formats import TagFormat, period_of_row


@dataclass(frozen=True, slots=True)
class Lease:
    """One leased range, half-open ``[start, end)``. ``secret`` (never in a repr)
    is what its return must show; only the lease answer carries it.

    A formatted tag's lease carries its format (``formats.py``; with an
    obfuscation key, which the node sends to every lease holder) and, with a
    reset, the UTC period its numbers belong to: ``[since, until)`` in unix
    seconds. Its numbers are only ever rendered with a date in that period, and
    ``tag`` is then the period's ledger row (``TAG@KEY``), where the tail goes back
    (its return shows the token of the tag itself, ``token_tag``).
    """

    lease_id: str
    tag: str
    start: int
    end: int
    format: TagFormat | None = None
    since: float = -math.inf
    until: float = math.inf
    secret: str = field(default="", repr=False, compare=False)
    # True when its period had already ended by this client's clock when it was
    # asked for (the node's clock is behind): used, rendered at the period's last
    # moment, never cut off, or the client would lease again and again while the
    # clocks differ. (A lease asked for before the end and answered after it is not
    # late: it is cut off, and the next one asked for.)
    late: bool = False

    def asked_at(self, asked: float) -> Lease:
        """This lease, answering a request sent at ``asked`` (by the client's clock)."""
        return replace(self, late=True) if asked >= self.until else self

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def fingerprint(self) -> str:
        """How the nodes' logs name this lease (never by its id or secret)."""
        return hashlib.sha256(self.lease_id.encode()).hexdigest()[:12]

    @property
    def token_tag(self) -> str:
        """The tag whose token the return shows: ``tag``, or the tag of its period row."""
        found = period_of_row(self.tag)
        return self.tag if found is None else found[0]


class Tokens:
    """Tag tokens: one per tag, and a default for the others. Never in a repr."""

    __slots__ = ("_by_tag", "_default")

    def __init__(self, by_tag: Mapping[str, str] | None = None, default: str | None = None) -> None:
        for value in [default, *(by_tag or {}).values()]:
            if value is not None and (not isinstance(value, str) or not value.isprintable()):
                raise ValueError("a token must be a printable string")
        self._by_tag = dict(by_tag or {})
        self._default = default

    def for_tag(self, tag: str) -> str | None:
        return self._by_tag.get(tag, self._default)

    def __repr__(self) -> str:
        return f"Tokens({len(self._by_tag)} tags, default={'set' if self._default else 'none'})"


@dataclass(frozen=True, slots=True)
class _Server:
    url: str
    https: bool
    host: str
    port: int
    base: str  # path prefix, e.g. "" or "/idpool"


def _parse(url: str) -> _Server:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL of an idpool node: {url!r}")
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    return _Server(url, https, parts.hostname, port, parts.path.rstrip("/"))


class Transport:
    def __init__(
        self,
        urls: list[str] | tuple[str, ...],
        timeout: float = 5.0,
        tokens: Tokens | None = None,
    ) -> None:
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("give at least one idpool node URL")
        self.servers = [_parse(u) for u in urls]
        self.timeout = timeout
        self.tokens = tokens or Tokens()
        self._first = 0  # the node that answered last is asked first
        self.calls = {"lease": 0, "return": 0}  # HTTP requests sent, for benchmarks

    def lease(self, tag: str, count: int) -> list[Lease]:
        """Lease about ``count`` IDs of ``tag``: one or more ranges, in serving order."""
        path = f"/lease/{quote(tag, safe='')}?count={max(1, count)}"
        body = self._post("lease", path, None, f"lease for tag {tag!r}", tag)
        try:
            fmt = None if body.get("format") is None else TagFormat.from_json(body["format"])
            period = body.get("period") or {}
            since = float(period.get("from", -math.inf))
            until = float(period.get("until", math.inf))
            return [
                Lease(
                    str(x["lease"]),
                    str(x.get("sequence", tag)),
                    int(x["first"]),
                    int(x["last"]) + 1,
                    fmt,
                    since,
                    until,
                    str(x["secret"]),
                )
                for x in body["leases"]
            ]
        except (KeyError, TypeError, ValueError) as e:
            # Not the body itself: it holds the leases' secrets.
            raise IdPoolError(
                f"a node answered a lease of tag {tag!r} in an unknown form "
                f"(fields: {sorted(body)}); is it an idpool node of this version?"
            ) from e

    def give_back(self, lease: Lease, start: int) -> int:
        """Return ``[start, lease.end)``; answers how many IDs went back.

        A try whose answer was lost may have landed, so a later try that hears
        ``already_returned`` has succeeded. Raises IdPoolRequestError when the
        node refuses (``unknown_lease``: Redis restarted or the lease expired;
        the tail is lost, never served twice) and IdPoolUnavailable.
        """
        payload = {"lease": lease.lease_id, "secret": lease.secret, "tag": lease.tag, "from": start}
        sent: list[bool] = []
        what = f"return of lease {lease.fingerprint} of tag {lease.tag!r}"
        try:
            body = self._post("return", "/lease/return", payload, what, lease.token_tag, sent)
        except IdPoolRequestError as e:
            if e.code == "already_returned" and len(sent) > 1:  # an earlier try landed
                return max(0, lease.end - start)
            raise
        return int(body.get("count", 0))

    def _post(
        self,
        kind: str,
        path: str,
        payload: dict[str, Any] | None,
        what: str,
        tag: str,
        sent: list[bool] | None = None,
    ) -> dict[str, Any]:
        failures: list[tuple[str, str]] = []
        n = len(self.servers)
        # Read once: another thread's call may move _first meanwhile, and reading it
        # per try could ask the same node twice and never the healthy one.
        first = self._first
        for k in range(n):
            index = (first + k) % n
            server = self.servers[index]
            self.calls[kind] += 1
            try:
                status, body = self._request(server, path, payload, tag, sent)
            except (OSError, http.client.HTTPException, ValueError) as e:
                failures.append((server.url, f"{type(e).__name__}: {e}"))
                continue
            if body.get("error") == _NOT_IDPOOL:  # another URL may be a node
                failures.append((server.url, str(body["message"])))
                continue
            if status >= 500:
                why = f"{status} {body.get('error')}: {body.get('message')}"
                failures.append((server.url, why))
                continue
            if status in (401, 403) and body.get("error") != "wrong_secret":
                raise IdPoolAuthError(
                    tag,
                    self.tokens.for_tag(tag) is not None,
                    server.url,
                    status,
                    str(body.get("error")),
                    str(body.get("message")),
                )
            if status >= 400:
                raise request_error(
                    server.url, status, str(body.get("error")), str(body.get("message"))
                )
            self._first = index
            return body
        raise IdPoolUnavailable(what, failures)

    def _request(
        self,
        server: _Server,
        path: str,
        payload: dict[str, Any] | None,
        tag: str,
        sent: list[bool] | None,
    ) -> tuple[int, dict[str, Any]]:
        cls = http.client.HTTPSConnection if server.https else http.client.HTTPConnection
        conn = cls(server.host, server.port, timeout=self.timeout)
        try:
            data = b"" if payload is None else json.dumps(payload).encode()
            headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
            token = self.tokens.for_tag(tag)
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            conn.request("POST", server.base + path, body=data, headers=headers)
            if sent is not None:
                sent.append(True)  # from here on the node may have acted on it
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        return resp.status, _body(server.url, resp.status, raw)


_NOT_IDPOOL = "not_idpool"  # no node sends it: the client's own word for a stranger


def _body(url: str, status: int, raw: bytes) -> dict[str, Any]:
    """The answer's JSON object. An error answer without idpool's ``error`` and
    ``message`` came from something else at that URL (another service, a proxy's
    page): said so, with what it answered, rather than "404 None: None"."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = None
    if isinstance(body, dict) and (status < 400 or isinstance(body.get("error"), str)):
        return body  # a JSON object; a refusal with its code
    shown = raw[:120].decode(errors="replace").strip() or "an empty body"
    return {
        "error": _NOT_IDPOOL,
        "message": f"{url} is not an idpool node (check the server URL): it answered "
        f"HTTP {status} with {shown!r}",
    }
