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

Here: the periods and ``TagFormat``. The template's grammar, its ``{id}``
renderings and their reading back are ``templates.py``; the permutation is
``obfuscation.py``; every name stays importable from here.

Standard library only: the client package has no dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from .obfuscation import KEY_BYTES, ROUNDS, Obfuscation, period_key
from .templates import (
    B36,
    B62,
    MAX_TEMPLATE,
    FormatError,
    check_template,
    date_step,
    id_renderer,
    missing_for_reset,
    moment_of,
    parse_template,
    part_width,
    take_parts,
)

# The names the node and users import from here, wherever they are defined
__all__ = [
    "KEY_BYTES",
    "MAX_TEMPLATE",
    "PERIOD_MARK",
    "RESETS",
    "ROUNDS",
    "FormatError",
    "Obfuscation",
    "TagFormat",
    "check_template",
    "period_bounds",
    "period_key",
    "period_of_row",
    "period_row",
    "whole_second",
    "within",
]

RESETS = ("daily", "monthly", "yearly")
PERIOD_MARK = "@"  # a period's ledger row is TAG@KEY; "@" is never in a tag a user names
_PERIOD_KEY = {"daily": "%Y%m%d", "monthly": "%Y%m", "yearly": "%Y"}


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
        self._parts = None if template is None else parse_template(template)
        if reset is not None:
            if reset not in RESETS:
                raise FormatError("bad_reset", f"reset {reset!r}: use {', '.join(RESETS)}")
            if self._parts is None:
                raise FormatError(
                    "bad_reset",
                    "a reset needs a format with the period's date, "
                    "e.g. 'INV-{date:%Y%m%d}-{id:06d}' for daily",
                )
            missing = missing_for_reset(reset, self._parts.directives)
            if missing is not None:
                raise FormatError(
                    "bad_reset",
                    f"a {reset} reset repeats {{id}} each period, so the format must show the "
                    f"period: {template!r} lacks {missing} in a {{date:...}} field",
                )
        self._id = str if self._parts is None else id_renderer(self._parts.id_spec)
        self._number: Callable[[int], int] = (
            (lambda n: n) if obfuscation is None else obfuscation.encode
        )
        self._step = date_step(self._parts.directives) if self._parts else 0
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
        head = take_parts(self._parts.before, text, 0, found)
        tail_width = sum(part_width(d, s) for d, s in self._parts.after)
        if len(text) - tail_width < head:
            raise ValueError(f"{text[:80]!r} is too short for the format")
        take_parts(self._parts.after, text, len(text) - tail_width, found)
        middle = text[head : len(text) - tail_width]
        return self._id_value(middle), moment_of(found)

    def _id_value(self, middle: str) -> int:
        assert self._parts is not None
        digits = middle.strip()
        spec = self._parts.id_spec
        if spec.endswith("b62") or spec.endswith("b36"):
            alphabet = B62 if spec.endswith("b62") else B36
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
