"""The rules a tag's name and row obey, whatever the ledger (MySQL, SQLite) or the
pool (Redis, SQLite) that keeps them: what a new row holds and when it is refused
(``NewRow``, run by every ledger's ``add_tag`` inside its transaction, under the
tombstone's lock), which kind a claim may take from a row (``check_kind``), and what
a name is recorded as beside its high-water mark (``name_fingerprint``) and what a
fence that finds another record answers (``record_kind``, ``used_as``).

A kind reaches these rules only as its ``KindRules`` (pool/kind_rules.py): no rule
here names a kind.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import FormatChanged, KindChanged, KindKept, NameUsedBefore
from .kind_rules import KindRules
from .values import TagRow, check_bound, step_bounds

# A tombstone as both ledgers select it (idpool_removed_tags), read by NewRow.values.
TOMBSTONE_COLUMNS = "max_id, options, secret, kind"
# A new row's columns, in the order of NewRow.values.
NEW_ROW_COLUMNS = (
    "tag, max_id, step, start_id, description, min_step, max_step, end_id, kind, layout, "
    "options, secret"
)


@dataclass(frozen=True)
class NewRow:
    """A tag a ledger is asked to make, its bounds checked (``checked``); the row it
    gets, or its refusal, once its name's tombstone is read (``values``)."""

    tag: str
    rules: KindRules
    step: int
    start: int
    description: str
    floor: int  # the high-water mark known outside the ledger (create_tag read it)
    min_step: int
    max_step: int
    end_id: int
    layout: str
    options: str
    secret: str = field(repr=False)

    @classmethod
    def checked(
        cls,
        tag: str,
        rules: KindRules,
        *,
        step: int,
        start: int,
        description: str,
        floor: int,
        min_step: int | None,
        max_step: int | None,
        end_id: int,
        layout: str,
        options: str,
        secret: str,
    ) -> NewRow:
        """The dynamic step within ``[min_step, max_step]`` (default: ``[step,
        DEFAULT_MAX_STEP]``); ValueError unless ``start < end_id``."""
        lo, hi = step_bounds(step, min_step, max_step)
        check_bound(start, end_id)
        return cls(tag, rules, step, start, description, floor, lo, hi, end_id, layout,
                   options, secret)  # fmt: skip

    def values(self, removed: Sequence[Any] | None) -> tuple[Any, ...]:
        """The row's values (NEW_ROW_COLUMNS), given the name's tombstone
        (TOMBSTONE_COLUMNS, None for none), read under the lock that keeps a removal
        out until the INSERT. A removed name comes back only as the kind and with the
        format it had (check_tombstone), and never as a kind made only under a new
        name (NameUsedBefore: a removal since create_tag looked). Its first ID is above
        every ID the name issued: ``max(start, floor, the tombstone's max_id)``."""
        rules = self.rules
        if removed is not None:
            kept = (str(removed[1]), str(removed[2]), str(removed[3]))
            check_tombstone(self.tag, kept, self.options, self.secret, rules.name)
            if rules.new_name_only:
                raise NameUsedBefore(self.tag, "a removed tag's tombstone")
        first = max(self.start, self.floor, 0 if removed is None else int(removed[0]))
        return (
            self.tag, first, self.step, self.start, self.description, self.min_step,
            self.max_step, stored_end(rules, self.end_id), rules.name, self.layout,
            self.options, self.secret,
        )  # fmt: skip


def stored_end(rules: KindRules, end_id: int) -> int:
    """The ``end_id`` column of a new row of a kind: negated where its rules say so
    (every kind but segment). A release from before kinds (7717122, the last of the
    old key layout) reads no ``kind`` column and serves every row as a segment tag,
    claiming plain ranges from a strict or snowflake row (out of order, or the
    numbers a snowflake generator makes). Its claim (``cut``) refuses a row whose
    ``max_id`` is at or above ``end_id`` (TagExhausted, nothing claimed), and its
    preloader skips a row with nothing ``left``: a negative ``end_id`` is both,
    whatever else its CLI changes (no command of it writes ``end_id``). Every ID is
    above 0, so a bound (at least 2) and its negation never meet. Read back by
    ``values.read_end``."""
    return -end_id if rules.end_negated else end_id


def check_kind(tag: str, expected: str, found: str) -> None:
    """A claim for a tag of kind ``expected`` on a row of kind ``found`` is refused
    (KindChanged): the caller's tag was removed and its name added again as
    another kind (or its kind edited by hand); until its next tag reload, a node
    still holding the old tag's buffer claimed plain ranges from a strict row."""
    if found != expected:
        raise KindChanged(tag, expected, found)


def check_tombstone(
    tag: str,
    old: tuple[str, str, str],
    options: str,
    secret: str,
    kind: str,
) -> None:
    """A removed name comes back only as the kind it was (raises KindKept: a stale
    node's buffer of the old tag would still serve it) and with the format it had
    (raises FormatChanged: another template or key could render a string the
    removed tag handed out, and its tombstone's ``max_id`` fences only the numbers).
    ``old`` is the tombstone's (options, secret, kind); kind '' is a tombstone made
    before kinds were kept, taken as any kind."""
    old_options, old_secret, old_kind = old
    if old_kind and old_kind != kind:
        raise KindKept(tag, old_kind, kind)
    if old_options == options and old_secret == secret:
        return
    before = f"with the format {old_options}" if old_options else "as a plain tag (no format)"
    raise FormatChanged(tag, f"(removed) {before}")


def format_fingerprint(options: str, secret: str) -> str:
    """What a tag's format (template, reset, obfuscation and its key) is known by
    beside its high-water mark (``idpool:{tag}:format``): "" for a plain tag. A hash,
    never the key: 128 random bits behind SHA-256 cannot be read back from it."""
    if not options:
        return ""
    return hashlib.sha256(f"{options}\n{secret}".encode()).hexdigest()[:32]


def name_fingerprint(row: TagRow, rules: KindRules) -> str:
    """What the name of ``row`` (a row of the kind ``rules``) is recorded as beside
    its mark: its format's fingerprint ("" for none: PLAIN_RECORD), or for a kind
    with a record prefix (snowflake) the prefix and a hash of its layout. A snowflake
    tag's numbers are not fenced by its ``max_id`` (it counts worker grants) and its
    layout (epoch, bits) makes them: recorded "plain" as a plain or strict tag is,
    its kind edited by hand to segment (or a plain name's to snowflake, or its epoch
    moved) repeated its IDs. A plain and a strict tag share "plain": both are fenced
    by the ledger."""
    return kind_fingerprint(rules, row.options, row.secret, row.layout)


def kind_fingerprint(rules: KindRules, options: str, secret: str, layout: str) -> str:
    """name_fingerprint of a tag about to be made (tag_changes.create_tag)."""
    if rules.record_prefix:
        return rules.record_prefix + hashlib.sha256(layout.encode()).hexdigest()[:32]
    return format_fingerprint(options, secret)


PLAIN_RECORD = "plain"  # a plain name's record beside its mark (a fingerprint is 32 hex)


def format_record(fingerprint: str) -> str:
    """What ``idpool:{tag}:format`` holds for a format: its fingerprint, or
    PLAIN_RECORD for a plain tag (so a format added by hand to a plain name's row
    is refused too, not recorded as the name's first)."""
    return fingerprint or PLAIN_RECORD


def record_kind(record: str) -> str | None:
    """The kind whose record (KindRules.record_prefix) ``record`` is, or None for a
    format's fingerprint or PLAIN_RECORD (neither has a colon). The Redis fence
    script reads it the same way (redis_marks._FENCE_FORMAT)."""
    kind, colon, _ = record.partition(":")
    return kind if colon else None


# A name with no record but worker-ID keys in Redis (keys.workers, keys.worker_lease:
# pool/worker_store.py) was a tag of this kind's, made and served before its kind had
# records (an upgrade): the fence answers it as it answers that kind's record.
WORKER_KEYS_KIND = "snowflake"

# The fence's answers (fence_format) that mean the record was written or was ours;
# any other ('other', 'unformatted', or a kind's name: record_kind) refuses the name.
FENCE_WRITTEN = ("same", "set")


def fence_refused(found: str) -> bool:
    """True when fence_format's answer ``found`` refuses the name ("" for no answer:
    no pool tier, or Redis down for a plain tag)."""
    return bool(found) and found not in FENCE_WRITTEN


def used_as(found: str) -> str:
    """How a name was used before, for FormatChanged, from a refusing fence answer."""
    if found == "other":
        return "with another format (its fingerprint is in Redis)"
    if found == "unformatted":
        return "as a plain tag (recorded so, or IDs were claimed under it)"
    return (
        f"as a {found} tag (or one of another layout): its IDs came from the clock, "
        "which no max_id fences"
    )
