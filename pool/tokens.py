"""Per-tag tokens: made here, stored hashed in the ledger, checked by nodes.

A tag with tokens is served only to a request that shows one of them. Tokens
are 256 random bits (``secrets.token_urlsafe(32)``), shown once when made and
stored only as their SHA-256. A fast hash is enough for such tokens: slow
password hashes (bcrypt, argon2) exist to make guessing *low-entropy* secrets
expensive, and 2^256 guesses are out of reach at any speed; a fast hash keeps
the check per request at about a microsecond. Hashes are compared with
``hmac.compare_digest`` (constant time), and a token is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class TokenRow:
    tag: str
    token_id: str  # names the token for `list` and `revoke`; not secret
    token_hash: str  # hex SHA-256 of the token
    created_at: datetime


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(token id, token): the token is shown once and stored only hashed."""
    return secrets.token_hex(4), secrets.token_urlsafe(32)


def matches(token: str, hashes: Collection[str]) -> bool:
    """Whether ``token`` is one of the tokens whose hashes are given. Every hash
    is compared, each in constant time: the time says nothing about which or
    how much of one matched."""
    given = hash_token(token).encode()
    found = False
    for known in hashes:
        found |= hmac.compare_digest(given, known.encode())
    return found
