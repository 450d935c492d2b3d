"""A format's template (``idpool_client/formats.py``): its grammar and checks,
the one-to-one renderings of ``{id}``, and the reading of a rendered string back
into its parts (``TagFormat.decode``). ``FormatError`` is every format option's
error (a template, a reset, an obfuscation bound).

Each part but ``{id}`` renders to a fixed width and there is one ``{id}``, so a
string splits into its parts one way only: that is what makes every rendered
string unique, and what ``take_parts`` reads back.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MAX_TEMPLATE = 128  # characters in a template
_DATE_DIRECTIVES = frozenset("YmdHMSjy%")
_DATE_SPEC_EXAMPLE = "{date:%Y%m%d}"
_ID_SPEC = re.compile(r"(0?)([1-9][0-9]?)?([,_]?)(b36|b62|[dxXob]?)")
B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class FormatError(ValueError):
    """A template, reset or bound that cannot be used; ``code`` names the option."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- {id} renderings ----------------------------------------------------------


def _digits(alphabet: str) -> Callable[[int], str]:
    base = len(alphabet)

    def render(n: int) -> str:
        if n == 0:
            return alphabet[0]
        out = []
        while n:
            n, r = divmod(n, base)
            out.append(alphabet[r])
        return "".join(reversed(out))

    return render


def id_renderer(spec: str) -> Callable[[int], str]:
    """The one-to-one rendering of ``{id:spec}``; raises FormatError."""
    match = _ID_SPEC.fullmatch(spec)
    if match is None:
        raise FormatError(
            "bad_format",
            f"{{id:{spec}}} is not an allowed id spec: use [0][width][,|_][d|x|X|o|b] "
            "(e.g. {id:06d}) or [0][width]b36 / [0][width]b62 (e.g. {id:b62})",
        )
    zero, width, group, kind = match.groups()
    if kind in ("b36", "b62"):
        if group:
            raise FormatError("bad_format", f"{{id:{spec}}}: b36/b62 take no grouping")
        digits = _digits(B36 if kind == "b36" else B62)
        size = int(width or 0)
        pad = "0" if zero else " "
        if not size:
            return digits
        return lambda n: digits(n).rjust(size, pad)
    try:
        format(1, spec)
    except ValueError as e:
        raise FormatError("bad_format", f"{{id:{spec}}} is not a valid id spec: {e}") from None
    if not spec or spec == "d":
        return str
    return lambda n: format(n, spec)


# -- the template --------------------------------------------------------------


@dataclass(frozen=True)
class TemplateParts:
    before: tuple[tuple[bool, str], ...]  # (is_date, text or strftime spec)
    id_spec: str
    after: tuple[tuple[bool, str], ...]
    directives: frozenset[str]  # strftime letters used by the date fields


def parse_template(template: str) -> TemplateParts:
    _check_text(template)
    try:
        pieces = list(string.Formatter().parse(template))
    except ValueError as e:
        raise FormatError("bad_format", f"format {template!r}: {e} (no literal braces)") from None
    before: list[tuple[bool, str]] = []
    after: list[tuple[bool, str]] = []
    id_spec: str | None = None
    directives: set[str] = set()
    for literal, name, spec, conversion in pieces:
        out = before if id_spec is None else after
        _check_piece(template, literal, name, spec, conversion)
        if literal:
            out.append((False, literal))
        if name is None:
            continue
        spec = spec or ""
        if name == "id":
            if id_spec is not None:
                raise FormatError("bad_format", f"format {template!r} has {{id}} twice: once only")
            id_renderer(spec)
            id_spec = spec
        elif name == "date":
            directives |= _check_date_spec(spec)
            out.append((True, spec))
        else:
            raise FormatError(
                "bad_format",
                f"format {template!r}: unknown field {{{name}}}: use {{id}} and {{date:...}}",
            )
    if id_spec is None:
        example = "'INV-{date:%Y%m%d}-{id:06d}'"
        raise FormatError("bad_format", f"format {template!r} has no {{id}}: e.g. {example}")
    return TemplateParts(tuple(before), id_spec, tuple(after), frozenset(directives))


def _check_text(template: str) -> None:
    """Refuse a template that is empty, too long or has an unprintable character."""
    if not isinstance(template, str) or not template:
        raise FormatError("bad_format", "format must be a non-empty template with one {id}")
    if len(template) > MAX_TEMPLATE:
        raise FormatError(
            "bad_format", f"format is {len(template)} characters long: at most {MAX_TEMPLATE}"
        )
    if not template.isprintable():
        # strftime stops at a NUL: '{date:%Y\x00%m%d}' would render '2026' every day,
        # so a daily reset repeated its strings; newlines would split /id answers.
        bad = next(c for c in template if not c.isprintable())
        raise FormatError(
            "bad_format",
            f"format {template!r}: {bad!r} is not allowed (no control or invisible characters)",
        )


def _check_piece(
    template: str, literal: str, name: str | None, spec: str | None, conversion: str | None
) -> None:
    """Refuse literal braces, and in a field a conversion or a nested field."""
    if "{" in literal or "}" in literal:
        raise FormatError(
            "bad_format", f"format {template!r}: literal braces ({{{{ or }}}}) are not allowed"
        )
    if name is not None and (conversion is not None or "{" in (spec or "")):
        raise FormatError(
            "bad_format", f"format {template!r}: no !r/!s conversions or nested fields"
        )


def _check_date_spec(spec: str) -> set[str]:
    if not spec:
        raise FormatError(
            "bad_format", f"{{date}} needs strftime directives, e.g. {_DATE_SPEC_EXAMPLE}"
        )
    found: set[str] = set()
    i = 0
    while i < len(spec):
        if spec[i] == "%":
            letter = spec[i + 1 : i + 2]
            if letter not in _DATE_DIRECTIVES:
                raise FormatError(
                    "bad_format",
                    f"{{date:{spec}}}: %{letter} is not allowed; use the fixed-width "
                    "%Y %m %d %H %M %S %j %y (or %% for a percent sign)",
                )
            found.add(letter)
            i += 2
        else:
            i += 1
    found.discard("%")
    if not found:
        raise FormatError("bad_format", f"{{date:{spec}}} has no date directive (%Y, %m, ...)")
    return found


def missing_for_reset(reset: str, directives: frozenset[str]) -> str | None:
    """What a template lacks to tell the periods of ``reset`` apart, or None."""
    year = "Y" in directives
    need = []
    if not year:
        need.append("%Y" + (" (not %y: it repeats every 100 years)" if "y" in directives else ""))
    if reset == "monthly" and "m" not in directives:
        need.append("%m")
    if reset == "daily" and "j" not in directives and not {"m", "d"} <= directives:
        lacking = " and ".join(f"%{d}" for d in "md" if d not in directives)
        need.append(f"{lacking} (or %j, the day of the year)")
    return " and ".join(need) or None


# -- reading a rendered string back --------------------------------------------


def date_step(directives: frozenset[str]) -> int:
    """How long a rendering of the date fields holds: the finest unit they show."""
    if "S" in directives:
        return 1
    if "M" in directives:
        return 60
    if "H" in directives:
        return 3600
    return 86400  # UTC days are 86,400 unix seconds; months and years end on day bounds


_DIRECTIVE_WIDTH = {"Y": 4, "m": 2, "d": 2, "H": 2, "M": 2, "S": 2, "j": 3, "y": 2}


def part_width(is_date: bool, text: str) -> int:
    """Characters a template part renders to: fixed (checked at creation)."""
    if not is_date:
        return len(text)
    width, i = 0, 0
    while i < len(text):
        if text[i] == "%":
            letter = text[i + 1]
            width += 1 if letter == "%" else _DIRECTIVE_WIDTH[letter]
            i += 2
        else:
            width += 1
            i += 1
    return width


def take_parts(
    parts: tuple[tuple[bool, str], ...], text: str, at: int, found: dict[str, int]
) -> int:
    """Read ``parts`` from ``text`` at ``at``: literals must match, each date
    directive gives its digits (the first of each letter to ``found``). Returns
    where they end; raises ValueError saying what does not match."""
    for is_date, spec in parts:
        if not is_date:
            if text[at : at + len(spec)] != spec:
                raise ValueError(f"{text[:80]!r} lacks {spec!r} at character {at + 1}")
            at += len(spec)
            continue
        i = 0
        while i < len(spec):
            if spec[i] != "%" or spec[i + 1] == "%":
                literal = spec[i] if spec[i] != "%" else "%"
                if text[at : at + 1] != literal:
                    raise ValueError(f"{text[:80]!r} lacks {literal!r} at character {at + 1}")
                at += 1
                i += 2 if spec[i] == "%" else 1
                continue
            letter = spec[i + 1]
            width = _DIRECTIVE_WIDTH[letter]
            digits = text[at : at + width]
            if len(digits) != width or not (digits.isascii() and digits.isdigit()):
                raise ValueError(
                    f"{text[:80]!r}: {digits!r} at character {at + 1} is not the {width} digits "
                    f"of %{letter} in {{date:{spec}}}"
                )
            found.setdefault(letter, int(digits))
            at += width
            i += 2
    return at


def moment_of(found: Mapping[str, int]) -> float:
    """A UTC moment with the date parts read from a string (ValueError if there is
    none: a 13th month, a 30th of February, a 366th day of a common year...)."""
    if "Y" in found:
        year = found["Y"]
    elif "y" in found:
        year = found["y"] + (1900 if found["y"] >= 70 else 2000)  # from 1970: renders alike
    else:
        year = 2000  # any year renders alike; a leap one, so 29 February and day 366 fit
    try:
        if "j" in found and not ("m" in found and "d" in found):
            if not 1 <= found["j"] <= 366:
                raise ValueError
            day = datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=found["j"] - 1)
            if day.year != year:
                raise ValueError
        else:
            day = datetime(year, found.get("m", 1), found.get("d", 1), tzinfo=UTC)
        at = day.replace(hour=found.get("H", 0), minute=found.get("M", 0), second=found.get("S", 0))
    except ValueError:
        shown = " ".join(f"%{k}={v}" for k, v in sorted(found.items()))
        raise ValueError(f"its date parts ({shown}) are no UTC date and time") from None
    if at.year < 1970:
        raise ValueError(f"its date ({at:%Y-%m-%d}) is before any ID was made (1970)")
    return at.timestamp()


def check_template(template: str) -> None:
    """Raise FormatError (saying what is wrong) unless ``template`` may be used."""
    parse_template(template)
