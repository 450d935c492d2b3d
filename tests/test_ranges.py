from __future__ import annotations

import pytest

from idpool.pool.ranges import MAX_ID, IdRange, is_valid_tag


def test_text_form_is_inclusive_and_round_trips() -> None:
    r = IdRange(1001, 2001)
    assert r.to_text() == "1001-2000"
    assert len(r) == 1000
    assert IdRange.from_text("1001-2000") == r
    assert IdRange.from_text(b"5-5") == IdRange(5, 6)


@pytest.mark.parametrize("text", ["", "12", "1-", "-5", "a-b", "5-3", "0-10", "1-2-3", " 1-2"])
def test_malformed_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        IdRange.from_text(text)


def test_range_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        IdRange(0, 10)
    with pytest.raises(ValueError):
        IdRange(10, 10)
    assert len(IdRange(MAX_ID, MAX_ID + 1)) == 1
    with pytest.raises(ValueError):
        IdRange(MAX_ID, MAX_ID + 2)


def test_split_covers_the_range_without_gap_or_overlap() -> None:
    parts = IdRange(1, 1001).split(300)
    assert [p.to_text() for p in parts] == ["1-300", "301-600", "601-900", "901-1000"]


@pytest.mark.parametrize("tag", ["orders", "a", "A-b_c.9", "9lives", "x" * 64])
def test_valid_tags(tag: str) -> None:
    assert is_valid_tag(tag)


@pytest.mark.parametrize(
    "tag", ["", "-x", ".x", "_x", "x" * 65, "a b", "a:b", "a*", "é", "a\n", "a/b", "a{b}"]
)
def test_invalid_tags(tag: str) -> None:
    assert not is_valid_tag(tag)
