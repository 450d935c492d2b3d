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
from idpool.pool.stores import HighWaterMarks, LedgerStore, parts_of
from idpool.pool.values import TagRow

from .formats import options_for
from .kinds import DEFAULT_KIND, KINDS, SPECS, Draft, KindSpec, names, spec_of

Spell = Callable[[str], str]
FORMAT_FIELDS = frozenset({"format", "reset", "obfuscate"})  # a format (formats.py)
# Every kind's own fields (a snowflake layout), and the flags naming a kind ("strict")
KIND_FIELDS = frozenset({f for spec in SPECS.values() for f in spec.fields})
KIND_FLAGS = frozenset(name for name, spec in SPECS.items() if spec.api_flag)
NEW_TAG_FIELDS = (
    frozenset({"tag", "step", "start", "description", "max", "kind"})
    | FORMAT_FIELDS
    | KIND_FIELDS
    | KIND_FLAGS
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
    """A tag to create, checked: what tag_changes.create_tag takes."""

    tag: str
    step: int
    start: int
    end_id: int  # first ID never handed out (max + 1; MAX_ID: no bound)
    description: str = ""
    kind: str = DEFAULT_KIND
    layout: str = ""  # a snowflake tag's Layout.to_text()
    options: str = ""  # JSON: format, reset, obfuscate (service/formats.py)
    secret: str = field(default="", repr=False)  # the obfuscation key, hex

    async def create(self, ledger: LedgerStore, pool: HighWaterMarks | None) -> TagRow:
        """Add the tag (tag_changes.create_tag: above any ID ever issued under its name),
        once its kind finds the stores can serve it (a snowflake tag needs Redis);
        then what its kind makes beside the row (a snowflake tag's worker hash)."""
        spec = spec_of(self.kind)
        parts = parts_of(ledger, pool)
        spec.check_stores(self.tag, parts)
        row = await create_tag(
            ledger,
            pool,
            self.tag,
            step=self.step,
            start=self.start,
            description=self.description,
            end_id=self.end_id,
            rules=spec.rules,
            layout=self.layout,
            options=self.options,
            secret=self.secret,
        )
        await spec.prepare(ledger, parts, row)
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
    kind = _asked_kind(fields, name)
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
    spec = spec_of(kind)
    _check_kind_fields(spec, fields, options, name)
    draft = spec.shape(fields, Draft(tag, step, start, end_id, top), name, lease_ms)
    return NewTag(
        tag,
        draft.step,
        draft.start,
        draft.end_id,
        description,
        kind,
        draft.layout,
        options=options,
        secret=secret,
    )


def _asked_kind(fields: Mapping[str, object], name: Spell) -> str:
    """The kind the fields ask for: ``kind``, or a kind's flag (``"strict": true``
    is kind strict); both only when they agree."""
    kind = check_kind(fields.get("kind", DEFAULT_KIND), name)
    for flagged in sorted(KIND_FLAGS):
        asked = fields.get(flagged, False)
        if not isinstance(asked, bool):
            raise InvalidInput("bad_kind", f"{name(flagged)} must be true or false")
        if asked:
            if "kind" in fields and kind != flagged:
                raise InvalidInput(
                    "bad_kind",
                    f"{name(flagged)} asks for kind {flagged}, {name('kind')} for {kind}",
                )
            kind = flagged
    return kind


def _check_kind_fields(
    spec: KindSpec, fields: Mapping[str, object], options: str, name: Spell
) -> None:
    """No format on a kind that renders none, no other kind's own field."""
    if options and not spec.formats:
        # A format renders a segment tag's numbers (service/formatted.py); another
        # kind would store it and hand out bare IDs.
        raise InvalidInput(
            "bad_format",
            f"{name('format')}, {name('reset')} and {name('obfuscate')} apply to "
            f"{', '.join(names(lambda s: s.formats))} tags only, not to kind {spec.name!r}",
        )
    given = sorted(f for f in KIND_FIELDS - spec.fields if fields.get(f) is not None)
    if given:  # another kind's field (a layout given to a segment tag)
        owner = next(s for s in SPECS.values() if given[0] in s.fields)
        raise InvalidInput(owner.fields_code, f"{name(given[0])} is for {owner.name} tags only")


def check_removable(row: TagRow) -> None:
    """Refuse (InvalidInput) to remove a tag its kind keeps (a snowflake tag)."""
    spec_of(row.kind).check_removable(row)


def check_range_change(row: TagRow, change: str) -> None:
    """Refuse (InvalidInput) a new ``start`` or ``step`` its kind has none of. A
    kind never changes, so reading the row first is enough."""
    spec_of(row.kind).check_range_change(row, change)


def _spelled(message: str, name: Spell) -> str:
    """A formats message with the options spelled the caller's way (--format)."""
    for option in ("format", "reset", "obfuscate"):
        message = message.replace(f"{option} ", f"{name(option)} ", 1)
    return message
