"""What the ledger, the pool and the preloader must know of a tag's kind.

The pool names no kind: each kind's module (``service/kinds/<name>.py``) makes its
one ``KindRules`` and the service hands it down (``create_tag``, the ledgers'
``add_tag``, the preloader). A row read back names its kind by its ``kind`` column;
``rules_of`` there (service/kinds) turns the name into these rules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KindRules:
    """One kind's answers to the questions the stores ask."""

    name: str  # the ledger's kind column
    # Its ranges go through the tag's Redis list: the preloader fills it, nodes pop
    # from it, clients lease from it (segment). False: the preloader skips the row.
    pooled: bool = False
    # Its row's end_id is stored negated (values.stored_end): a release from before
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
    # else this prefix and a hash of its layout (snowflake: "snowflake:").
    record_prefix: str = ""
