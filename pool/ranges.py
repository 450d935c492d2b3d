"""ID ranges and their text form in Redis.

A range is half-open in code, ``[start, end)``, and written inclusive in Redis
as ``"first-last"`` (``"1001-2000"`` holds 1000 IDs) so that ``redis-cli LRANGE``
reads naturally.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

MAX_ID = 2**63 - 1  # IDs are positive signed 64-bit integers (BIGINT in MySQL)
MAX_STEP = 2**31 - 1  # the ledger's step column is a signed 32-bit INT
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TAG_RULE = "1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit"


@dataclass(frozen=True, slots=True, order=True)
class IdRange:
    start: int  # first ID in the range
    end: int  # first ID after the range

    def __post_init__(self) -> None:
        if not 0 < self.start < self.end <= MAX_ID + 1:
            raise ValueError(f"not a valid ID range: [{self.start}, {self.end})")

    def __len__(self) -> int:
        return self.end - self.start

    def to_text(self) -> str:
        return f"{self.start}-{self.end - 1}"

    @classmethod
    def from_text(cls, text: str | bytes) -> IdRange:
        if isinstance(text, bytes):
            text = text.decode()
        first, sep, last = text.partition("-")
        if not sep or not first.isdigit() or not last.isdigit():
            raise ValueError(f"not a range in 'first-last' form: {text!r}")
        return cls(int(first), int(last) + 1)

    def split(self, size: int) -> list[IdRange]:
        """Cut into consecutive ranges of ``size`` IDs (the last may be shorter)."""
        return [IdRange(s, min(s + size, self.end)) for s in range(self.start, self.end, size)]


class TaggedRange(NamedTuple):
    """A range of one tag: what a Redis script names as ``tag=first-last``."""

    tag: str
    range: IdRange

    @classmethod
    def from_text(cls, text: str | bytes) -> TaggedRange:
        if isinstance(text, bytes):
            text = text.decode()
        tag, _, rest = text.partition("=")
        return cls(tag, IdRange.from_text(rest))


def tagged_ranges(texts: Iterable[str | bytes]) -> list[TaggedRange]:
    """The ``tag=first-last`` items of a script's answer, as values (parsed here only)."""
    return [TaggedRange.from_text(t) for t in texts]


def is_valid_tag(tag: str) -> bool:
    return TAG_PATTERN.fullmatch(tag) is not None
