"""What the client raises: every error is an ``IdPoolError``."""

from __future__ import annotations


class IdPoolError(Exception):
    """Base class of everything idpool_client raises on purpose."""


class IdPoolUnavailable(IdPoolError):
    """No ID in memory and no node could lease a range.

    ``failures`` lists each server URL tried with why it failed (connection
    error, timeout, HTTP 5xx with the node's message).
    """

    def __init__(self, what: str, failures: list[tuple[str, str]]) -> None:
        tried = "; ".join(f"{url}: {why}" for url, why in failures) or "no server tried"
        super().__init__(f"{what}: every idpool node failed ({tried})")
        self.failures = failures


class IdPoolRequestError(IdPoolError):
    """A node refused the request (HTTP 4xx): an unknown or invalid tag, a bad
    return. Trying another node would get the same answer, so none is tried.

    ``code`` is the node's error code (``unknown_tag``, ``bad_tag``, ...).
    """

    def __init__(self, url: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{url} answered {status} {code}: {message}")
        self.url = url
        self.status = status
        self.code = code
        self.message = message


class IdPoolAuthError(IdPoolRequestError):
    """A node refused the tag's token (HTTP 401, or 403): the tag is guarded and
    the client sent no token for it, or one the tag does not have. ``tag`` names
    the tag; the token itself is never in the message."""

    def __init__(
        self, tag: str, token_sent: bool, url: str, status: int, code: str, message: str
    ) -> None:
        super().__init__(url, status, code, message)
        sent = "a token the tag does not accept" if token_sent else "no token for it"
        self.args = (
            f"tag {tag!r} needs one of its tokens and this client sent {sent} "
            f"({url} answered {status} {code}); pass tokens={{{tag!r}: ...}} or token=... "
            "to the client (`idpool tag token add` makes one)",
        )
        self.tag = tag
        self.token_sent = token_sent


class IdPoolStrictTag(IdPoolRequestError):
    """The tag is strict (created ``--strict``): its IDs must increase in real time
    across every caller, which only the nodes can do, so a client library may not
    lease ranges of it. Ask a node for each ID (``GET /id/{tag}``, ``/ids/{tag}``)."""


def request_error(url: str, status: int, code: str, message: str) -> IdPoolRequestError:
    """The error for a node's 4xx answer: the class its ``error`` code names."""
    if code == "strict_tag":
        return IdPoolStrictTag(url, status, code, message)
    return IdPoolRequestError(url, status, code, message)


class IdPoolClosed(IdPoolError):
    """The client was closed; its unused IDs went back to the pool."""


class SnowflakeStopped(IdPoolError):
    """No snowflake ID now: the worker ID's lease is lost or about to expire, or
    the clock is far behind the last time used. ``why`` says which."""
