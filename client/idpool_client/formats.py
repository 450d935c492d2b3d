"""Per-tag ID formats: one module, used by the idpool node and by the client.

A tag may carry a *format* on top of its sequence of numbers (docs/design/formats.md,
"ID formats"):

- a **template** in ``str.format`` style with exactly one ``{id}`` field and any
  number of ``{date:...}`` fields, e.g. ``INV-{date:%Y%m%d}-{id:06d}`` gives
  ``INV-20261124-000001``. ``{id}`` takes ``[0][width][,|_][d|x|X|o|b]`` or
  ``[0][width]b36`` / ``[0][width]b62`` (base 36: ``0-9a-z``; base 62:
  ``0-9A-Za-z``); ``{date}`` takes the fixed-width strftime directives
  ``%Y %m %d %H %M %S %j %y`` (and ``%%``), rendered in UTC at the moment the ID
  is handed out.
- a **reset** (``daily``, ``monthly``, ``yearly``): ``{id}`` counts from 1 again
  each UTC period. The numbers of one period come from a sequence of that
  period alone (the ledger row ``TAG@KEY``, ``KEY`` like ``20261124``), and a
  number is always rendered with a date of its own period.
- **obfuscation**: the number handed out is a keyed permutation of the
  sequence number over ``[1, top]`` (a Feistel network on the bit width, cycle
  walking down to ``top``), so it is unique but does not show how many IDs were
  taken. ``decode`` maps it back. With a reset, a tag added since issue 28 has
  *period keys*: each period's permutation is keyed by ``period_key(tag key,
  period key)``, so the n-th ID of one day says nothing of another's (with one
  key for every period, the n-th ID of each day rendered alike, and one day's
  values gave the next day's volume). Older tags keep their one key: a number
  rendered under a new key could equal one rendered under the old key in the
  same period.

Why every string is unique: each field but ``{id}`` renders to a fixed width,
and there is one ``{id}``, so a string splits into its parts one way only; the
``{id}`` renderings allowed are one-to-one; the number is unique in its tag (or,
with a reset, in its period, whose date fields are in the string). So two equal
strings would need the same number in the same period: never.

Standard library only: the client package has no dependencies.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

MAX_TEMPLATE = 128  # characters in a template
RESETS = ("daily", "monthly", "yearly")
ROUNDS = 4  # Feistel rounds (even: the halves end where they started)
KEY_BYTES = 16
PERIOD_MARK = "@"  # a period's ledger row is TAG@KEY; "@" is never in a tag a user names
_PERIOD_KEY = {"daily": "%Y%m%d", "monthly": "%Y%m", "yearly": "%Y"}
_DATE_DIRECTIVES = frozenset("YmdHMSjy%")
_DATE_SPEC_EXAMPLE = "{date:%Y%m%d}"
_ID_SPEC = re.compile(r"(0?)([1-9][0-9]?)?([,_]?)(b36|b62|[dxXob]?)")
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


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


def _id_renderer(spec: str) -> Callable[[int], str]:
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
        digits = _digits(_B36 if kind == "b36" else _B62)
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
class _Parts:
    before: tuple[tuple[bool, str], ...]  # (is_date, text or strftime spec)
    id_spec: str
    after: tuple[tuple[bool, str], ...]
    directives: frozenset[str]  # strftime letters used by the date fields


def _parse(template: str) -> _Parts:
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
        if "{" in literal or "}" in literal:
            raise FormatError(
                "bad_format", f"format {template!r}: literal braces ({{{{ or }}}}) are not allowed"
            )
        if literal:
            out.append((False, literal))
        if name is None:
            continue
        spec = spec or ""
        if conversion is not None or "{" in spec:
            raise FormatError(
                "bad_format", f"format {template!r}: no !r/!s conversions or nested fields"
            )
        if name == "id":
            if id_spec is not None:
                raise FormatError("bad_format", f"format {template!r} has {{id}} twice: once only")
            _id_renderer(spec)
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
    return _Parts(tuple(before), id_spec, tuple(after), frozenset(directives))


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


def _missing_for_reset(reset: str, directives: frozenset[str]) -> str | None:
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


# -- periods -------------------------------------------------------------------


def whole_second(now: float) -> int:
    """The unix second holding ``now``: every date field and period is rendered and
    chosen from it. ``datetime.fromtimestamp`` rounds to the microsecond, so the
    last float before a midnight (0.24 us before it, in 2026) gave the next day's
    date while a comparison of the raw float still chose the old day's period: a
    number of the old period's sequence rendered with the new day, which the new
    period's sequence hands out again. Every allowed directive is in seconds, and
    every period bound and cache window is a whole second, so comparing the raw
    float with them agrees with this floor."""
    return math.floor(now)


def period_bounds(reset: str, now: float) -> tuple[str, float, float]:
    """(key, first second, first second after) of the UTC period holding ``now``."""
    at = datetime.fromtimestamp(whole_second(now), UTC)
    if reset == "daily":
        start = datetime(at.year, at.month, at.day, tzinfo=UTC)
        end = start + timedelta(days=1)
    elif reset == "monthly":
        start = datetime(at.year, at.month, 1, tzinfo=UTC)
        end = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
    elif reset == "yearly":
        start = datetime(at.year, 1, 1, tzinfo=UTC)
        end = datetime(at.year + 1, 1, 1, tzinfo=UTC)
    else:
        raise FormatError("bad_reset", f"reset {reset!r}: use {', '.join(RESETS)}")
    return start.strftime(_PERIOD_KEY[reset]), start.timestamp(), end.timestamp()


def within(now: float, since: float, until: float) -> float:
    """``now``, or the nearest moment of the period ``[since, until)``: a number of
    that period is never rendered with another period's date, whatever the clocks."""
    if now < since:
        return since
    return now if now < until else until - 0.001


def period_row(tag: str, key: str) -> str:
    """The ledger row (and pool list) of one period of a reset tag."""
    return f"{tag}{PERIOD_MARK}{key}"


def period_of_row(name: str) -> tuple[str, str] | None:
    """(tag, period key) for a period's row name, None for a tag's own."""
    tag, mark, key = name.rpartition(PERIOD_MARK)
    return (tag, key) if mark and key.isdigit() else None


# -- obfuscation ---------------------------------------------------------------


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


# -- a tag's format ------------------------------------------------------------


class TagFormat:
    """How a tag's sequence numbers become the IDs it hands out."""

    def __init__(
        self,
        template: str | None = None,
        reset: str | None = None,
        obfuscation: Obfuscation | None = None,
        period_keys: bool = False,
    ) -> None:
        self.template = template
        self.reset = reset
        self.obfuscation = obfuscation
        # Each reset period's numbers permuted with its own key (period_key); else
        # one key for every period (tags from before: kept, see the module doc)
        self.period_keys = period_keys and reset is not None and obfuscation is not None
        self._parts = None if template is None else _parse(template)
        if reset is not None:
            if reset not in RESETS:
                raise FormatError("bad_reset", f"reset {reset!r}: use {', '.join(RESETS)}")
            if self._parts is None:
                raise FormatError(
                    "bad_reset",
                    "a reset needs a format with the period's date, "
                    "e.g. 'INV-{date:%Y%m%d}-{id:06d}' for daily",
                )
            missing = _missing_for_reset(reset, self._parts.directives)
            if missing is not None:
                raise FormatError(
                    "bad_reset",
                    f"a {reset} reset repeats {{id}} each period, so the format must show the "
                    f"period: {template!r} lacks {missing} in a {{date:...}} field",
                )
        self._id = str if self._parts is None else _id_renderer(self._parts.id_spec)
        self._number: Callable[[int], int] = (
            (lambda n: n) if obfuscation is None else obfuscation.encode
        )
        self._step = _date_step(self._parts.directives) if self._parts else 0
        self._dates = (0.0, -1.0, "", "")  # (from, until, rendered before, rendered after)
        self._period = ("", 0.0, -1.0)  # (key, from, until)
        self._keyed: tuple[float, float, Obfuscation | None] = (0.0, -1.0, None)

    @property
    def text(self) -> bool:
        """True: IDs are strings (a template); False: integers."""
        return self._parts is not None

    def __repr__(self) -> str:
        hidden = "" if self.obfuscation is None else f", max={self.obfuscation.top}"
        return f"TagFormat({self.template!r}, reset={self.reset!r}{hidden})"

    def period(self, now: float) -> tuple[str, float, float]:
        """(key, from, until) of the reset period holding ``now`` (cached)."""
        cached = self._period
        if cached[1] <= now < cached[2]:
            return cached
        assert self.reset is not None
        self._period = found = period_bounds(self.reset, now)
        return found

    def obfuscation_at(self, now: float) -> Obfuscation | None:
        """The permutation numbers handed out at ``now`` go through (cached)."""
        if not self.period_keys:
            return self.obfuscation
        since, until, found = self._keyed
        if found is not None and since <= now < until:
            return found
        assert self.obfuscation is not None and self.reset is not None
        key, since, until = period_bounds(self.reset, now)
        found = Obfuscation(period_key(self.obfuscation.key, key), self.obfuscation.top)
        # One tuple, assigned at once: threads of a client read it without a lock.
        self._keyed = (since, until, found)
        return found

    def _number_at(self, now: float) -> Callable[[int], int]:
        if not self.period_keys:
            return self._number
        ob = self.obfuscation_at(now)
        assert ob is not None
        return ob.encode

    def render(self, n: int, now: float) -> str | int:
        """The ID for sequence number ``n`` handed out at ``now`` (unix seconds)."""
        value = self._number(n) if not self.period_keys else self._number_at(now)(n)
        if self._parts is None:
            return value
        start, until, before, after = self._dates
        if not start <= now < until:
            start, until, before, after = self._render_dates(now)
        return before + self._id(value) + after

    def render_many(self, numbers: Iterable[int], now: float) -> list[str] | list[int]:
        """IDs for ``numbers``, all handed out at ``now``."""
        number = self._number_at(now)
        if self._parts is None:
            return [number(n) for n in numbers]
        start, until, before, after = self._dates
        if not start <= now < until:
            start, until, before, after = self._render_dates(now)
        rendered = self._id
        return [before + rendered(number(n)) + after for n in numbers]

    def _render_dates(self, now: float) -> tuple[float, float, str, str]:
        assert self._parts is not None
        second = whole_second(now)  # never rounded up into the next second (or day)
        at = datetime.fromtimestamp(second, UTC)
        before = "".join(at.strftime(s) if d else s for d, s in self._parts.before)
        after = "".join(at.strftime(s) if d else s for d, s in self._parts.after)
        step = self._step
        # Whole seconds: the window [start, start + step) holds exactly the floats
        # whose floor renders as above (step > 0 whenever there is a date field).
        start = float(second - second % step) if step else float("-inf")
        # One tuple, assigned at once: threads of a client read it without a lock.
        self._dates = found = (start, start + step if step else float("inf"), before, after)
        return found

    def decode(self, value: int | str) -> int:
        """The sequence number of an ID this format made (with a reset: the
        number within its period). Raises ValueError, saying what does not match,
        for anything the format never makes: the decoded number (at the decoded
        date) must render back to exactly ``value``.

        It checks the spelling only: whether the number was ever handed out is
        the ledger's to say (``max_id``; ``idpool tag decode`` and the admin call
        check it). Without a ledger, a well-spelt number never issued decodes."""
        return self.decode_period(value)[0]

    def earliest(self, value: int | str) -> float | None:
        """The earliest moment (UTC seconds) the date in ``value`` can name, when
        the template shows a year (else None: any year renders alike). A moment
        after it is when the ID was made; so a date ahead of the clock was never
        handed out. ValueError as ``decode``."""
        if self._parts is None or not {"Y", "y"} & self._parts.directives:
            return None
        return self._split(str(value))[1]

    def latest(self, value: int | str) -> float | None:
        """The last moment (UTC seconds) the date in ``value`` can name, when the
        template shows a year (else None): the end of the finest unit it shows
        with every coarser one (a year; its month; its day; hour; minute; second).
        An ID whose date ends before its tag was made was never handed out."""
        start = self.earliest(value)
        if start is None:
            return None
        assert self._parts is not None
        shown = self._parts.directives
        at = datetime.fromtimestamp(start, UTC)
        if "j" in shown or {"m", "d"} <= shown:
            span = timedelta(days=1)
            for unit, length in (("H", 3600), ("M", 60), ("S", 1)):
                if unit not in shown:
                    break
                span = timedelta(seconds=length)
            return (at + span).timestamp() - 1e-3
        if "m" in shown:  # the month
            following = at.replace(year=at.year + at.month // 12, month=at.month % 12 + 1)
            return following.timestamp() - 1e-3
        return at.replace(year=at.year + 1).timestamp() - 1e-3

    def decode_period(self, value: int | str) -> tuple[int, str | None]:
        """(sequence number, key of its period, None without a reset) of an ID this
        format made: the period names the ledger row (``TAG@KEY``) it came from."""
        text = str(value)
        if self._parts is None:
            if not (text.isascii() and text.isdigit()):
                raise ValueError(f"{text[:40]!r} is not a decimal number")
            moment = 0.0
            n = self._sequence(int(text), moment)
        else:
            value, moment = self._split(text)
            n = self._sequence(value, moment)
        again = self._render_at(n, moment)
        if again != text:
            raise ValueError(
                f"{text[:80]!r} is not what the format makes: sequence number {n} "
                f"renders as {again[:80]!r}"
            )
        if self.reset is None:
            return n, None
        try:
            return n, period_bounds(self.reset, moment)[0]
        except (OverflowError, ValueError):  # a period ending past 9999-12-31
            raise ValueError(f"{text[:80]!r}: its period ends past any UTC date") from None

    def _sequence(self, number: int, moment: float) -> int:
        """The sequence number of ``number`` (the {id} value, handed out at
        ``moment``); ValueError if none."""
        try:
            ob = self.obfuscation_at(moment)
        except (OverflowError, ValueError):  # a period ending past 9999-12-31: no key
            raise ValueError(f"{number}: its period ends past any UTC date") from None
        if ob is not None:
            return ob.decode(number)  # ValueError outside 1..max
        if number < 1:
            raise ValueError(f"{number} is not a sequence number (they start at 1)")
        return number

    def _render_at(self, n: int, moment: float) -> str:
        """What ``render`` gives, without touching its cache (decode runs beside it)."""
        value = self._number_at(moment)(n)
        if self._parts is None:
            return str(value)
        at = datetime.fromtimestamp(whole_second(moment), UTC)
        before = "".join(at.strftime(s) if d else s for d, s in self._parts.before)
        after = "".join(at.strftime(s) if d else s for d, s in self._parts.after)
        return before + self._id(value) + after

    def _split(self, text: str) -> tuple[int, float]:
        """(the {id} value, a moment whose date parts are the string's) of a
        templated ID; ValueError naming the part that does not match."""
        assert self._parts is not None
        found: dict[str, int] = {}
        # Every part but {id} has a fixed width: cut them off both ends.
        head = _take_parts(self._parts.before, text, 0, found)
        tail_width = sum(_width(d, s) for d, s in self._parts.after)
        if len(text) - tail_width < head:
            raise ValueError(f"{text[:80]!r} is too short for the format")
        _take_parts(self._parts.after, text, len(text) - tail_width, found)
        middle = text[head : len(text) - tail_width]
        return self._id_value(middle), _moment(found)

    def _id_value(self, middle: str) -> int:
        assert self._parts is not None
        digits = middle.strip()
        spec = self._parts.id_spec
        if spec.endswith("b62") or spec.endswith("b36"):
            alphabet = _B62 if spec.endswith("b62") else _B36
            if not digits or any(c not in alphabet for c in digits):
                raise ValueError(f"{middle[:40]!r} is not a base-{len(alphabet)} number")
            n = 0
            for ch in digits:
                n = n * len(alphabet) + alphabet.index(ch)
            return n
        kind = spec[-1] if spec[-1:] in ("x", "X", "o", "b") else "d"
        radix = {"d": 10, "x": 16, "X": 16, "o": 8, "b": 2}[kind]
        plain = digits.replace(",", "").replace("_", "")
        if not plain.isascii() or not plain.isalnum():
            raise ValueError(f"{middle[:40]!r} is not a base-{radix} number")
        try:
            return int(plain, radix)
        except ValueError:
            raise ValueError(f"{middle[:40]!r} is not a base-{radix} number") from None

    def to_json(self, secret: bool, period: str | None = None) -> dict[str, Any]:
        """The format as JSON; with ``secret``, the obfuscation key too (the lease
        answer: a client must render as the node does). With period keys, only
        the key of ``period`` (``period_key``: the lease's period, the only one
        its numbers are rendered in), never the tag's."""
        out: dict[str, Any] = {"template": self.template, "reset": self.reset}
        ob = self.obfuscation
        out["obfuscate"] = ob is not None
        if ob is not None:
            out["max"] = ob.top
            if secret and self.period_keys:
                assert period is not None  # a reset tag's lease names its period
                out["period_key"] = period_key(ob.key, period).hex()
            elif secret:
                out["key"] = ob.key.hex()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TagFormat:
        """The inverse of ``to_json(secret=True)``. With ``period_key`` (no
        ``key``: a client before period keys refuses the lease), a format for the
        lease's period alone: its numbers are rendered with a date of it only."""
        ob = None
        if data.get("obfuscate"):
            key = data["period_key"] if "period_key" in data else data["key"]
            ob = Obfuscation(bytes.fromhex(str(key)), int(data["max"]))
        return cls(data.get("template"), data.get("reset"), ob)


def _date_step(directives: frozenset[str]) -> int:
    """How long a rendering of the date fields holds: the finest unit they show."""
    if "S" in directives:
        return 1
    if "M" in directives:
        return 60
    if "H" in directives:
        return 3600
    return 86400  # UTC days are 86,400 unix seconds; months and years end on day bounds


_DIRECTIVE_WIDTH = {"Y": 4, "m": 2, "d": 2, "H": 2, "M": 2, "S": 2, "j": 3, "y": 2}


def _width(is_date: bool, text: str) -> int:
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


def _take_parts(
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


def _moment(found: Mapping[str, int]) -> float:
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
    _parse(template)
