"""pool/tag_rules.py and pool/kind_rules.py: the rules a new row obeys, read only
from its kind's KindRules (the pool names no kind). The ledgers run them against
MariaDB and SQLite in tests/test_ledger.py; here the rules alone."""

from __future__ import annotations

import pytest

from idpool.pool.errors import FormatChanged, KindKept, NameUsedBefore
from idpool.pool.kind_rules import DEFAULT_KIND, DEFAULT_RULES, KindRules, default_rules_of
from idpool.pool.tag_rules import (
    NewRow,
    fence_refused,
    kind_fingerprint,
    record_kind,
    stored_end,
    used_as,
)
from idpool.service.kinds import rules_of


def _new(rules: KindRules, **kw: object) -> NewRow:
    fields: dict[str, object] = dict(step=10, start=5, description="", floor=0, min_step=None,
                                     max_step=None, end_id=100, layout="", options="", secret="")
    fields.update(kw)
    return NewRow.checked("t", rules, **fields)  # type: ignore[arg-type]


def test_the_service_segment_rules_are_the_pools_default() -> None:
    assert rules_of(DEFAULT_KIND) == DEFAULT_RULES
    assert default_rules_of(DEFAULT_KIND) == DEFAULT_RULES
    assert not default_rules_of("strict").pooled  # the pool alone pools its default only


def test_an_unknown_kind_is_not_pooled_and_has_no_record_prefix() -> None:
    rules = rules_of("unheard-of")
    assert rules == KindRules("unheard-of")
    assert not rules.pooled and rules.record_prefix == ""


def test_a_record_prefix_is_the_kinds_name() -> None:
    with pytest.raises(ValueError, match="record_prefix"):
        KindRules("x", record_prefix="y:")
    record = kind_fingerprint(rules_of("snowflake"), "", "", "layout")
    assert record.startswith("snowflake:") and record_kind(record) == "snowflake"
    assert record_kind("plain") is None and record_kind("0" * 32) is None


def test_the_fence_answers() -> None:
    assert not fence_refused("") and not fence_refused("same") and not fence_refused("set")
    assert fence_refused("other") and fence_refused("unformatted") and fence_refused("snowflake")
    assert used_as("snowflake") == (
        "as a snowflake tag (or one of another layout): its IDs came from the clock, "
        "which no max_id fences"
    )


def test_the_end_is_negated_only_where_the_rules_say() -> None:
    assert stored_end(DEFAULT_RULES, 100) == 100
    assert stored_end(rules_of("strict"), 100) == -100
    assert _new(rules_of("strict")).values(None)[7] == -100


def test_a_new_row_starts_above_the_floor_and_the_tombstone() -> None:
    assert _new(DEFAULT_RULES).values(None)[1] == 5
    assert _new(DEFAULT_RULES, floor=7).values(None)[1] == 7
    assert _new(DEFAULT_RULES).values((40, "", "", DEFAULT_KIND))[1] == 40
    assert _new(DEFAULT_RULES).values((40, "", "", ""))[1] == 40  # from before kinds: any


def test_a_tombstone_keeps_its_kind_and_format_and_refuses_a_new_name_kind() -> None:
    with pytest.raises(KindKept):
        _new(rules_of("strict")).values((40, "", "", DEFAULT_KIND))
    with pytest.raises(FormatChanged):
        _new(DEFAULT_RULES, options='{"format": "x{id}"}').values((40, "", "", DEFAULT_KIND))
    with pytest.raises(NameUsedBefore):
        _new(rules_of("snowflake")).values((40, "", "", ""))
    with pytest.raises(ValueError):
        _new(DEFAULT_RULES, start=100)
