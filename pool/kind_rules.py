"""What the ledger, the pool and the preloader must know of a tag's kind.

The pool names no kind: each kind's module (``service/kinds/<name>.py``) makes its
one ``KindRules`` and the service hands it down (``create_tag``, the ledgers'
``add_tag``, the preloader, the strict counter). A row read back names its kind by
its ``kind`` column; ``rules_of`` there (service/kinds) turns the name into these
rules. The one name the pool keeps is the schema's: ``DEFAULT_KIND``, what the
ledger's ``kind`` column holds for a row made before kinds (or made here without a
kind, as the tests do).
"""

from __future__ import annotations

from dataclasses import dataclass

# The ledger's `kind` column default (pool/ledger_schema.py SCHEMA, pool/sqlite_file.py):
# every row a release before kinds made has it, and a release before kinds serves
# every row as one (values.read_end says why the others' rows refuse it).
DEFAULT_KIND = "segment"


@dataclass(frozen=True)
class KindRules:
    """One kind's answers to the questions the stores ask."""

    name: str  # the ledger's kind column
    # Its ranges go through the tag's Redis list: the preloader fills it, nodes pop
    # from it, clients lease from it (segment). False: the preloader skips the row.
    pooled: bool = False
    # Its row's end_id is stored negated (tag_rules.stored_end): a release from before
    # kinds serves every row as a segment tag and must claim nothing from it.
    end_negated: bool = True
    # Made only under a name that never issued IDs (no tombstone, no mark): its IDs
    # are not fenced by the ledger's max_id (snowflake: made from the clock).
    new_name_only: bool = False
    # Its Redis state is fenced at max(start, mark) before its row is made, so a
    # state an earlier life of the name left is never served from (strict).
    fences_state: bool = False
    # Made only with Redis up: its record or its state is written before the row.
    needs_redis: bool = False
    # The name's record beside its mark: "" -> its format's fingerprint (or plain);
    # else this prefix and a hash of its layout (snowflake: "snowflake:"). The prefix
    # is the kind's name and ":": a fence that finds such a record answers the name
    # (tag_rules.record_kind), and no fingerprint or "plain" has a colon.
    record_prefix: str = ""

    def __post_init__(self) -> None:
        if self.record_prefix and self.record_prefix != f"{self.name}:":
            raise ValueError(f"kind {self.name!r}: record_prefix must be {self.name + ':'!r}")


# The rules a row of DEFAULT_KIND has: pooled, its end_id as it is (a release before
# kinds claims from it as it always did). service/kinds' segment kind is the same.
DEFAULT_RULES = KindRules(DEFAULT_KIND, pooled=True, end_negated=False)


def default_rules_of(name: str) -> KindRules:
    """The rules the pool knows without the service's registry: DEFAULT_RULES for
    DEFAULT_KIND, and for any other name a kind with nothing pooled (what the
    preloader did before it was handed service/kinds' ``rules_of``)."""
    return DEFAULT_RULES if name == DEFAULT_KIND else KindRules(name)
