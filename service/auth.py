"""Per-tag tokens at the node: does a request show one of its tag's tokens?

The tokens' hashes come with the node's copy of the tag list
(``service/tags.py``); see ``pool/tokens.py`` for how they are made and why
SHA-256. ``check_token`` is the check of every tag route (``app.py``'s ID
routes, ``workers.py``, ``decode.py``); the lease route (``leases.py``) calls
``allowed``. The fast path never answers a tag that has tokens.
"""

from __future__ import annotations

from starlette.requests import Request

from idpool.pool.tokens import matches

from .errors import HttpRefusal
from .tags import TagDirectory


def presented(request: Request) -> str | None:
    """The token a request shows: ``Authorization: Bearer <token>``, or a
    ``token`` query parameter for Leaf-style clients that cannot send headers."""
    scheme, _, credential = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credential:
        return credential
    return request.query_params.get("token")


def allowed(tags: TagDirectory, tag: str, request: Request) -> bool:
    """True for a tag without tokens, or a request showing one of them. The tag
    must have been looked up (its tokens are read with its row)."""
    hashes = tags.tokens.get(tag)
    if not hashes:
        return True
    given = presented(request)
    return given is not None and matches(given, hashes)


def refusal_message(tag: str) -> str:
    return (
        f"tag {tag!r} needs one of its tokens: send Authorization: Bearer <token> "
        "or ?token=<token> (`idpool tag token add` makes one)"
    )


async def check_token(tags: TagDirectory, tag: str, request: Request) -> None:
    """Nothing when the tag has no tokens or the request shows one of them; else
    raises the 401 (or the tag's own failure: unknown, disabled). Before anything
    that tells of the tag (its kind, its layout, its IDs)."""
    if tag not in tags.rows:
        await tags.lookup(tag)  # the tokens are read with the tag
    if not allowed(tags, tag, request):
        raise HttpRefusal("unauthorized", refusal_message(tag), {"www-authenticate": "Bearer"})
