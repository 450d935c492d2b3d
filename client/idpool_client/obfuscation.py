"""Obfuscation (``idpool_client/formats.py``): the number a tag hands out is a
keyed permutation of the sequence number over ``[1, top]`` (a Feistel network
on the bit width, cycle walking down to ``top``), so it is unique but does not
show how many IDs were taken; ``decode`` maps it back. ``period_key`` gives
each reset period of a tag with period keys its own key.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from .templates import FormatError

ROUNDS = 4  # Feistel rounds (even: the halves end where they started)
KEY_BYTES = 16


class Obfuscation:
    """A keyed permutation of ``[1, top]``. The key never shows in a repr."""

    __slots__ = ("key", "top", "_bits", "_rounds")

    def __init__(self, key: bytes, top: int) -> None:
        if len(key) < 8 or not 2 <= top < 2**63:
            raise FormatError("bad_obfuscate", "obfuscation needs a key and a max from 2 to 2^63-1")
        self.key = key
        self.top = top
        self._bits = max(2, (top - 1).bit_length())
        # One keyed BLAKE2b per round (the round number as its personalisation):
        # the Feistel round functions, a PRF each.
        self._rounds = [
            hashlib.blake2b(key=key, digest_size=8, person=b"idpool-r%d" % i) for i in range(ROUNDS)
        ]

    def __repr__(self) -> str:
        return f"Obfuscation(key=<hidden>, top={self.top})"

    def _feistel(self, x: int, order: Iterable[int], inverse: bool) -> int:
        bits, rounds = self._bits, self._rounds
        a = bits // 2
        b = bits - a
        if not inverse:
            # (left: a bits, right: b bits); each round: left, right = right, left ^ F(right)
            left, right, lbits, rbits = x >> b, x & ((1 << b) - 1), a, b
            for i in order:
                f = _prf(rounds[i], right) & ((1 << lbits) - 1)
                left, right, lbits, rbits = right, left ^ f, rbits, lbits
            return (left << rbits) | right
        # undo the rounds from the last: right_before = left_after,
        # left_before = right_after ^ F(right_before)
        left, right, lbits, rbits = x >> b, x & ((1 << b) - 1), a, b
        for i in order:
            f = _prf(rounds[i], left) & ((1 << rbits) - 1)
            left, right, lbits, rbits = right ^ f, left, rbits, lbits
        return (left << rbits) | right

    def encode(self, n: int) -> int:
        """The value handed out for sequence number ``n`` (1 <= n <= top)."""
        if not 1 <= n <= self.top:
            raise ValueError(f"{n} is outside 1..{self.top}")
        x = n - 1
        while True:  # cycle walking: a permutation of [0, 2^bits) stays in [0, top)
            x = self._feistel(x, range(ROUNDS), False)
            if x < self.top:
                return x + 1

    def decode(self, value: int) -> int:
        """The sequence number ``value`` was made from (the inverse of encode)."""
        if not 1 <= value <= self.top:
            raise ValueError(f"{value} is outside 1..{self.top}")
        x = value - 1
        while True:
            x = self._feistel(x, range(ROUNDS - 1, -1, -1), True)
            if x < self.top:
                return x + 1


def period_key(key: bytes, period: str) -> bytes:
    """The obfuscation key of one reset period (``period``: its key, ``20261127``)
    of a tag with period keys: HMAC-SHA256 of the tag's key, cut to KEY_BYTES. One
    period's key tells nothing of the tag's key or of another period's."""
    mac = hmac.new(key, b"idpool-period:" + period.encode("ascii"), hashlib.sha256)
    return mac.digest()[:KEY_BYTES]


def _prf(hasher: Any, half: int) -> int:
    h = hasher.copy()
    h.update(half.to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little")
