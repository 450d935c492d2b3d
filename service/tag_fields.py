"""The checks on what an operator gives for a tag, shared by the admin API
(``service/admin.py``) and the CLI (``service/cli/tag.py``): one function per
field, raising InvalidInput whose code names the field (``bad_step``, ...).

``name`` spells a field the caller's way in the message: ``step`` over HTTP,
``--step`` on the command line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from idpool.pool.claims import create_tag
from idpool.pool.errors import InvalidInput
from idpool.pool.ranges import MAX_ID, MAX_STEP, TAG_RULE, is_valid_tag
from idpool.pool.redis_pool import RedisPool
from idpool.pool.snowflake import LAYOUT_FIELDS, check_layout, wall_ms
from idpool.pool.stores import HighWaterMarks, LedgerStore
from idpool.pool.values import TagRow

from .formats import options_for
from .kinds import KINDS, SEGMENT, rules_of
from .snowflake import SNOWFLAKE, prepare_tag
from .strict_tags import STRICT

Spell = Callable[[str], str]
# A snowflake tag's layout: a preset (``layout``) and overrides of its fields
SNOWFLAKE_FIELDS = frozenset({"layout", *LAYOUT_FIELDS})
NEW_TAG_FIELDS = (
    frozenset({"tag", "step", "start", "description", "max", "kind", "strict"})
    | frozenset({"format", "reset", "obfuscate"})  # a segment tag's format (formats.py)
    | SNOWFLAKE_FIELDS
)


def _as_is(field: str) -> str:
    return field


def check_tag(value: object) -> str:
    if not isinstance(value, str) or not is_valid_tag(value):
        raise InvalidInput("bad_tag", f"{str(value)[:80]!r} is not a valid tag: use {TAG_RULE}")
    return value


def check_int(field: str, value: object, top: int, name: Spell = _as_is) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise InvalidInput(f"bad_{field}", f"{name(field)} must be an integer from 1 to {top}")
    return value


def check_kind(value: object, name: Spell = _as_is) -> str:
    if not isinstance(value, str) or value not in KINDS:
        raise InvalidInput(
            "bad_kind",
            f"{name('kind')} {str(value)[:40]!r} is not a kind of ID: use {', '.join(KINDS)}",
        )
    return value


@dataclass(frozen=True)
class NewTag:
    """A tag to create, checked: what claims.create_tag takes."""

    tag: str
    step: int
    start: int
    end_id: int  # first ID never handed out (max + 1; MAX_ID: no bound)
    description: str = ""
    kind: str = SEGMENT
    layout: str = ""  # a snowflake tag's Layout.to_text()
    options: str = ""  # JSON: format, reset, obfuscate (service/formats.py)
    secret: str = field(default="", repr=False)  # the obfuscation key, hex

    async def create(self, ledger: LedgerStore, pool: HighWaterMarks | None) -> TagRow:
        """Add the tag (claims.create_tag: above any ID ever issued under its name);
        a snowflake tag gets its worker hash (snowflake.prepare_tag). A snowflake
        tag needs Redis (its worker IDs are leased there): none in embedded mode,
        where it was made and then refused on every request."""
        if self.kind == SNOWFLAKE and not isinstance(pool, RedisPool):
            raise InvalidInput(
                "bad_kind",
                f"tag {self.tag!r}: snowflake tags need Redis, where their worker IDs are "
                "leased; not in embedded mode (use a segment tag, or run with Redis)",
            )
        row = await create_tag(
            ledger,
            pool,
            self.tag,
            step=self.step,
            start=self.start,
            description=self.description,
            end_id=self.end_id,
            rules=rules_of(self.kind),
            layout=self.layout,
            options=self.options,
            secret=self.secret,
        )
        await prepare_tag(ledger, pool, row)
        return row


def new_tag(
    fields: Mapping[str, object], default_step: int, name: Spell = _as_is, *, lease_ms: int = 0
) -> NewTag:
    """A new tag from its fields (only ``tag`` is required); raises InvalidInput.
    ``lease_ms`` (IDPOOL_WORKER_LEASE_SECONDS of whoever adds it) becomes a
    snowflake tag's worker-lease TTL, recorded in its row for every node."""
    unknown = sorted(set(fields) - NEW_TAG_FIELDS)
    if unknown:
        raise InvalidInput(
            "bad_body",
            f"unknown field {unknown[0]!r}: a new tag takes "
            f"{', '.join(sorted(NEW_TAG_FIELDS))} (only tag is required)",
        )
    tag = check_tag(fields.get("tag"))
    step = check_int("step", fields.get("step", default_step), MAX_STEP, name)
    start = check_int("start", fields.get("start", 1), MAX_ID, name)
    top = fields.get("max")
    if top is not None:
        top = check_int("max", top, MAX_ID - 1, name)
        if top < start:
            raise InvalidInput("bad_max", f"{name('max')} {top} is below {name('start')} {start}")
    description = fields.get("description", "")
    if not isinstance(description, str) or len(description) > 255:
        raise InvalidInput(
            "bad_description", f"{name('description')} must be a string of at most 255"
        )
    kind = check_kind(fields.get("kind", SEGMENT), name)
    strict = fields.get("strict", False)
    if not isinstance(strict, bool):
        raise InvalidInput("bad_kind", f"{name('strict')} must be true or false")
    if strict:  # "strict": true is kind strict (IDs in real-time order across nodes)
        if "kind" in fields and kind != STRICT:
            raise InvalidInput(
                "bad_kind", f"{name('strict')} asks for kind strict, {name('kind')} for {kind}"
            )
        kind = STRICT
    end_id = MAX_ID if top is None else top + 1
    try:
        options, secret = options_for(
            tag,
            fields.get("format"),
            fields.get("reset"),
            fields.get("obfuscate", False),
            end_id,
        )
    except InvalidInput as e:
        raise InvalidInput(e.code, _spelled(str(e), name)) from None
    if options and kind != SEGMENT:
        # A format renders a segment tag's sequence (service/formats.py); another
        # kind would store it and hand out bare IDs.
        raise InvalidInput(
            "bad_format",
            f"{name('format')}, {name('reset')} and {name('obfuscate')} apply to "
            f"{SEGMENT} tags only, not to kind {kind!r}",
        )
    given = sorted(f for f in SNOWFLAKE_FIELDS if fields.get(f) is not None)
    if kind != SNOWFLAKE:
        if given:
            raise InvalidInput("bad_layout", f"{name(given[0])} is for snowflake tags only")
        return NewTag(tag, step, start, end_id, description, kind, options=options, secret=secret)
    moved = [f for f in ("start", "step") if fields.get(f) is not None]
    if moved:
        # Its max_id counts worker-ID grants: a start near 2^63 would leave it a few
        # grants for its whole life (as PATCH refuses: snowflake.check_range_change).
        raise InvalidInput(
            "wrong_kind",
            f"a snowflake tag takes no {name(moved[0])} (its IDs come from the clock, a "
            "worker ID and a sequence; its row counts worker-ID grants): give a layout",
        )
    if top is not None:
        raise InvalidInput("bad_body", f"a snowflake tag takes no {name('max')}: give a layout")
    layout = check_layout({f: fields.get(f) for f in given}, wall_ms(), name)
    # The row counts worker-ID grants (max_id: one generation per grant) and keeps the
    # tag's worker-lease TTL beside its layout (``.l10000``, pool/snowflake.py
    # lease_ms_of): one value every node grants with, so a quarantine outlasts them all.
    text = layout.to_text() + (f".l{lease_ms}" if lease_ms > 0 else "")
    return NewTag(tag, 1, start, MAX_ID, description, kind, text)


def _spelled(message: str, name: Spell) -> str:
    """A formats message with the options spelled the caller's way (--format)."""
    for option in ("format", "reset", "obfuscate"):
        message = message.replace(f"{option} ", f"{name(option)} ", 1)
    return message
