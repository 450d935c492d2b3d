"""``idpool tag ...``: add, list, step, start, disable, enable, and a tag's tokens.

The values are checked by ``service/tag_fields.py``, as the admin API checks
them; the messages name the options (``--step``) instead of the JSON fields.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial

from idpool_client.formats import RESETS

from idpool.pool.claims import ListNotEmptied, disable_tag, enable_tag, move_start, remove_tag
from idpool.pool.errors import (
    InvalidInput,
    StartAboveMax,
    StartBelowIssued,
    StartOnReset,
    StoreUnavailable,
    TagExists,
    UnknownTag,
)
from idpool.pool.ranges import MAX_ID, MAX_STEP
from idpool.pool.settings import Settings
from idpool.pool.stores import LedgerStore, open_ledger, open_pool
from idpool.pool.tokens import hash_token, new_token
from idpool.pool.values import TagRow
from idpool.pool.waste import Reason, WasteRecorder

from ..decode import decode_issued
from ..formats import split_periods, tag_list_entry
from ..kinds import DEFAULT_KIND, SPECS, spec_of
from ..status import runway_seconds, runway_text
from ..tag_fields import NewTag, check_int, check_range_change, check_removable, new_tag
from .common import EXIT_UNAVAILABLE, EXIT_USAGE, checked, counted, flag, integer, show, tag_arg


def add_parsers(sub: argparse._SubParsersAction, embedded: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    tag = sub.add_parser("tag", help="manage tags").add_subparsers(
        dest="tag_command", required=True
    )
    add = tag.add_parser("add", parents=[embedded], help="create a tag")
    add.add_argument("tag", type=tag_arg)
    add.add_argument("--step", type=integer, default=None, help="IDs per range")
    add.add_argument("--start", type=integer, default=None, help="first ID (default 1)")
    add.add_argument("--description", default="")
    add.add_argument(
        "--max",
        type=integer,
        default=None,
        help="highest ID the tag may hand out, e.g. 9007199254740991 to stay exact in "
        "JavaScript (default: no bound below 2^63)",
    )
    flagged = [name for name, spec in SPECS.items() if spec.cli_flag_help]
    add.add_argument(
        "--kind",
        default=None,
        help=f"how its IDs are made: {', '.join(SPECS)} (default: {DEFAULT_KIND}); "
        f"{' and '.join(f'--{name}' for name in flagged)} name a kind too: give one",
    )
    for name in flagged:  # a flag per kind that has one (--strict, --snowflake)
        add.add_argument(f"--{name}", action="store_true", help=SPECS[name].cli_flag_help)
    for spec in SPECS.values():  # each kind's own fields (a snowflake layout)
        spec.cli_arguments(add, integer)
    add.add_argument(
        "--format",
        default=None,
        help="render IDs with a template: one {id} ({id:06d}, {id:b36}, {id:b62}) and any "
        "{date:%%Y%%m%%d} (UTC), e.g. 'INV-{date:%%Y%%m%%d}-{id:06d}'",
    )
    add.add_argument(
        "--reset",
        choices=RESETS,
        default=None,
        help="restart {id} at 1 each UTC day, month or year (the --format must show that period)",
    )
    add.add_argument(
        "--obfuscate",
        action="store_true",
        help="hand out unique numbers that do not show the count: a keyed permutation of "
        "1..--max (default 2^63-2)",
    )
    decode = tag.add_parser(
        "decode",
        parents=[embedded],
        help="what an ID says: a segment ID's sequence number (through its format), a "
        "snowflake ID's time, worker ID and sequence",
    )
    decode.add_argument("tag", type=tag_arg)
    decode.add_argument("value")
    tag.add_parser(
        "list", parents=[embedded], help="list tags: ledger position, bound, runway, state"
    )
    for verb, what in (
        ("disable", "stop serving a tag (410 tag_disabled); its ready ranges become waste"),
        ("enable", "serve a disabled tag again, from fresh ranges"),
    ):
        toggle = tag.add_parser(verb, parents=[embedded], help=what)
        toggle.add_argument("tag", type=tag_arg)
    token = tag.add_parser("token", help="a tag's tokens").add_subparsers(
        dest="token_command", required=True
    )
    token_add = token.add_parser(
        "add", parents=[embedded], help="make a token; from then on the tag needs one"
    )
    token_add.add_argument("tag", type=tag_arg)
    token_list = token.add_parser("list", parents=[embedded], help="a tag's token ids")
    token_list.add_argument("tag", type=tag_arg)
    revoke = token.add_parser("revoke", parents=[embedded], help="delete one token")
    revoke.add_argument("tag", type=tag_arg)
    revoke.add_argument("token_id")
    step = tag.add_parser("step", parents=[embedded], help="change a tag's range size")
    step.add_argument("tag", type=tag_arg)
    step.add_argument("step", type=checked(partial(check_int, "step", top=MAX_STEP)))
    remove = tag.add_parser(
        "remove",
        parents=[embedded],
        help="delete a tag for good: 404 unknown_tag, tokens dropped, ready ranges wasted; "
        "the name added again starts above every ID it issued",
    )
    remove.add_argument("tag", type=tag_arg)
    remove.add_argument("--yes", action="store_true", help="do it (without: say what it does)")
    start = tag.add_parser(
        "start", parents=[embedded], help="move a tag's next ID forward (never back)"
    )
    start.add_argument("tag", type=tag_arg)
    start.add_argument("start", type=checked(partial(check_int, "start", top=MAX_ID)))


async def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.tag_command == "add":
        return await _add(settings, args)  # checked before any store is opened
    ledger = await open_ledger(settings)
    try:
        if args.tag_command == "step":
            return await _step(ledger, args)
        if args.tag_command == "start":
            return await _start(settings, ledger, args)
        if args.tag_command in ("disable", "enable"):
            return await _toggle(settings, ledger, args)
        if args.tag_command == "remove":
            return await _remove(settings, ledger, args)
        if args.tag_command == "token":
            return await _token(ledger, args)
        if args.tag_command == "decode":
            return await _decode(ledger, args)
        return await _list(settings, ledger)
    except UnknownTag:
        print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    finally:
        await ledger.close()


def _kind_named(args: argparse.Namespace) -> str | None:
    """The one kind --kind, --strict and --snowflake name; raises InvalidInput when
    they name two (the admin API refuses {"kind": ..., "strict": true} alike)."""
    named = {"--kind": args.kind}
    for name, spec in SPECS.items():
        if spec.cli_flag_help:
            named[f"--{name}"] = name if getattr(args, name) else None
    given = {flag_: kind for flag_, kind in named.items() if kind is not None}
    if len(set(given.values())) > 1:
        shown = " and ".join(f"--kind {k}" if f == "--kind" else f for f, k in given.items())
        raise InvalidInput(
            "bad_kind", f"{shown} name different kinds: give one (a tag's kind never changes)"
        )
    return next(iter(given.values()), None)


async def _add(settings: Settings, args: argparse.Namespace) -> int:
    try:
        spec = new_tag(
            _add_fields(args),
            settings.default_step,
            flag,
            lease_ms=int(settings.worker_lease_seconds * 1000),
        )
    except InvalidInput as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_USAGE
    row = await _create(settings, spec, args.tag)
    if row is None:
        return EXIT_USAGE
    _print_added(settings, spec, row)
    return 0


def _add_fields(args: argparse.Namespace) -> dict[str, object]:
    """The new tag's fields from ``tag add``'s options, as the admin API takes them;
    raises InvalidInput when the options name two kinds."""
    fields: dict[str, object] = {"tag": args.tag, "description": args.description}
    if args.start is not None:
        fields["start"] = args.start  # given: a snowflake tag refuses it
    kind = _kind_named(args)
    fields.update(max=args.max, format=args.format, reset=args.reset, obfuscate=args.obfuscate)
    if kind is not None and spec_of(kind).api_flag:
        fields[kind] = True  # as --strict alone always said it
    else:
        fields["kind"] = kind or DEFAULT_KIND
    if args.step is not None:
        fields["step"] = args.step
    for field in sorted({f for spec in SPECS.values() for f in spec.fields}):
        if getattr(args, field, None) is not None:
            fields[field] = getattr(args, field)
    return fields


async def _create(settings: Settings, spec: NewTag, tag: str) -> TagRow | None:
    """The tag's row once made in the ledger; None (the reason printed) when refused."""
    ledger = await open_ledger(settings)
    try:
        # No check: with Redis down a tag can still be added (without its high-water
        # mark); a pool that answers as the wrong server still raises ConfigError.
        pool = await open_pool(settings, check=False)
    except BaseException:
        await ledger.close()
        raise
    try:
        return await spec.create(ledger, pool)
    except TagExists:
        print(f"idpool: tag {tag!r} already exists (see `idpool tag list`)", file=sys.stderr)
        return None
    except InvalidInput as e:  # FormatChanged, NameUsedBefore, a kind the mode cannot serve
        print(f"idpool: {e}", file=sys.stderr)
        return None
    finally:
        await pool.close()
        await ledger.close()


def _print_added(settings: Settings, spec: NewTag, row: TagRow) -> None:
    note = ""
    if row.max_id > spec.start:
        note = f" (IDs up to {row.max_id - 1} were issued before under this tag; starting after)"
    bound = "" if row.max is None else f", max {row.max}"
    kind = "" if spec_of(row.kind).default else f", kind {row.kind}"
    line = spec_of(row.kind).cli_added(row)  # a kind's own (a snowflake layout)
    if line is not None:
        print(line)
    else:
        shown = tag_list_entry(row)
        formatted = f", format {shown}" if shown else ""
        first = f"first ID {row.max_id}, step {row.step}"
        print(f"added {row.tag}: {first}{bound}{kind}{formatted}{note}")
    # Where: a node on another ledger answers 404 for it (a missing database named by a
    # misspelt or default URL is created by `tag add` as by `serve`)
    print(f"  in the {settings.ledger_shown()}")


async def _list(settings: Settings, ledger: LedgerStore) -> int:
    rows, periods = split_periods(await ledger.list_tags())
    # The runway needs the cluster's rate from the pool; without it, "-".
    pool = await open_pool(settings, check=False)
    try:
        pooled = await pool.summaries([row.tag for row in rows])
    except StoreUnavailable:
        pooled = {}
    finally:
        await pool.close()
    print(
        f"{'tag':<24} {'max_id':>20} {'step':>10} {'start':>12} {'max':>20} "
        f"{'runway':>10} {'state':>8}  description"
    )
    # Grouped by kind, each group under one line naming it: the rows keep their columns.
    for kind in sorted({row.kind for row in rows}, key=lambda k: (not spec_of(k).default, k)):
        group = [row for row in rows if row.kind == kind]
        print(f"-- kind {kind}: {counted(len(group), 'tag')}")
        for row in group:
            lines = spec_of(row.kind).cli_listed(row)  # a kind's own (snowflake: its layout)
            if lines is not None:
                for line in lines:
                    print(line)
                continue
            found = pooled.get(row.tag)
            rate = float(found.stats["rate"]) if found and "rate" in found.stats else None
            runway = runway_seconds(row, found.ids if found else 0, rate)
            print(
                f"{row.tag:<24} {row.max_id:>20} {row.step:>10} {row.start_id:>12} "
                f"{show(row.max):>20} {runway_text(runway, row.max is not None, ''):>10} "
                f"{'disabled' if row.disabled else 'enabled':>8}  {row.description}"
            )
            shown = tag_list_entry(row)
            if shown:  # a format: under its row, so the columns stay as they were
                # The period rows in one summary, never a line each: they pile up.
                rows_of = sorted(periods.get(row.tag, {}).items())
                now = "".join(
                    f"; periods: {len(rows_of)}, latest {k}: max_id {p.max_id}"
                    for k, p in rows_of[-1:]
                )
                print(f"{'':<24} format {shown}{now}")
    return 0


async def _decode(ledger: LedgerStore, args: argparse.Namespace) -> int:
    try:
        found = await decode_issued(ledger, await ledger.get_tag(args.tag), args.value)
    except InvalidInput as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_USAGE
    lines = spec_of(found["kind"]).cli_decoded(found)  # snowflake: time, worker, sequence
    if lines is not None:
        for line in lines:
            print(line)
        return 0
    note = f" ({found['note']})" if "note" in found else ""
    print(f"{found['tag']} {found['value']}: sequence number {found['sequence']}{note}")
    return 0


async def _refused_change(ledger: LedgerStore, tag: str, change: str) -> bool:
    try:
        check_range_change(await ledger.get_tag(tag), change)  # a tag's kind never changes
    except InvalidInput as e:
        print(f"idpool: {e}", file=sys.stderr)
        return True
    return False


async def _step(ledger: LedgerStore, args: argparse.Namespace) -> int:
    if await _refused_change(ledger, args.tag, "step"):
        return EXIT_USAGE
    row = await ledger.set_step(args.tag, args.step)
    periods = " (and its period rows: the current one, and those to come)" if row.by_period else ""
    print(f"{row.tag}: step is now {row.step}{periods}; ranges already claimed keep their size")
    return 0


async def _start(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    if await _refused_change(ledger, args.tag, "start"):
        return EXIT_USAGE
    # No check: with Redis down the ledger's own max_id still refuses a start below it.
    pool = await open_pool(settings, check=False)
    try:
        row = await move_start(ledger, pool, args.tag, args.start)
    except (StartBelowIssued, StartAboveMax, StartOnReset) as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        await pool.close()
    print(
        f"{row.tag}: the next range claimed starts at {row.max_id}; "
        "ranges already in the pool or in nodes are served first"
    )
    return 0


async def _token(ledger: LedgerStore, args: argparse.Namespace) -> int:
    await ledger.get_tag(args.tag)
    if args.token_command == "add":
        token_id, token = new_token()
        await ledger.add_token(args.tag, token_id, hash_token(token))
        # The token alone on stdout (TOKEN=$(idpool tag token add TAG)), the words
        # on stderr; never a log line: this is the one time the token is shown.
        print(
            f"{args.tag}: token {token_id} added; keep it now, it is stored only hashed. "
            f"{args.tag} now needs a token (Authorization: Bearer <token> or ?token=) "
            "at every node within IDPOOL_TAG_RELOAD_SECONDS",
            file=sys.stderr,
        )
        print(token)
        return 0
    if args.token_command == "revoke":
        if not await ledger.revoke_token(args.tag, args.token_id):
            print(f"idpool: tag {args.tag!r} has no token {args.token_id!r}", file=sys.stderr)
            return EXIT_USAGE
        print(f"{args.tag}: token {args.token_id} revoked")
        return 0
    rows = await ledger.list_tokens(args.tag)
    if not rows:
        print(f"{args.tag}: no tokens; served to anyone")
    for row in rows:
        print(f"{row.token_id}  created {row.created_at:%Y-%m-%d %H:%M:%S} UTC")
    return 0


async def _toggle(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    if args.tag_command == "enable":
        row = await enable_tag(ledger, args.tag)
        print(f"{row.tag}: enabled; {_goes_on(row)}")
        return 0
    pool = await open_pool(settings, check=False)
    try:
        row, drained = await disable_tag(ledger, pool, args.tag)
    except StoreUnavailable as e:
        print(
            f"idpool: {args.tag!r} is disabled, but its ready ranges could not be "
            f"removed ({e}); run the command again",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    finally:
        await pool.close()
    WasteRecorder().record(row.tag, drained, Reason.TAG_DISABLED)  # logged; counted nowhere
    ids = sum(map(len, drained))
    # A reset tag's own row is never claimed from (TagRow.by_period): its max_id says
    # nothing; its period rows are disabled with it and keep theirs.
    kept = f"max_id {row.max_id} is kept"
    if row.by_period:
        kept = "its period rows and their max_id are kept"
    print(
        f"{row.tag}: disabled (410 tag_disabled at every node within "
        f"IDPOOL_TAG_RELOAD_SECONDS); {ids} ready IDs in {counted(len(drained), 'range')} "
        f"wasted; {kept}"
    )
    return 0


def _goes_on(row: TagRow) -> str:
    """Where a tag's numbers go on (enabled, or added again after a removal)."""
    if row.by_period:
        return "each period's numbers go on above what that period issued (its period rows)"
    return f"the next range claimed starts at {row.max_id}"


def _added_again(row: TagRow) -> str:
    """What the name of a removed tag does when added again."""
    if row.by_period:
        # A reset tag's own row is never claimed from: its max_id says nothing.
        return (
            "its period rows stay, so the name added again (with the same format) goes "
            "on above what each period issued"
        )
    return f"the name added again starts at {row.max_id} or above"


async def _remove(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    with contextlib.suppress(UnknownTag):  # (removed before: the list may need emptying)
        try:
            check_removable(await ledger.get_tag(args.tag))  # a tag's kind never changes
        except InvalidInput as e:
            print(f"idpool: {e}", file=sys.stderr)
            return EXIT_USAGE
    if not args.yes:
        row = await ledger.get_tag(args.tag)
        again = _added_again(row)
        print(
            f"idpool: this removes {row.tag} for good: requests get 404 unknown_tag, its "
            f"tokens are dropped, its ready ranges are wasted, and {again}; "
            "run again with --yes to remove it",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # The pool first: one that answers as the wrong server (ConfigError) stops the
    # removal before the ledger changes, not after
    pool = await open_pool(settings, check=False)
    removed: TagRow | None = None
    try:
        removed, drained = await remove_tag(ledger, pool, args.tag)
    except UnknownTag:  # removed before: its list may still need emptying
        drained = await pool.take_all(args.tag)
        if not drained:
            if await ledger.removed_format(args.tag) is not None:
                # the run "again" a half-done removal asked for, once the nodes or a
                # new Redis incarnation emptied the list: nothing is left to do
                print(
                    f"idpool: tag {args.tag!r} does not exist: it was removed before and "
                    "nothing of it is left in the pool (its tombstone keeps its max_id)",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            raise UnknownTag(args.tag) from None
    except ListNotEmptied as e:
        print(
            f"idpool: {args.tag!r} is removed, but its ready ranges could not be taken out of "
            f"the pool ({e.error}); run the command again",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    finally:
        await pool.close()
    WasteRecorder().record(args.tag, drained, Reason.TAG_REMOVED)  # logged; counted nowhere
    kept = "" if removed is None else f"; {_added_again(removed)}"
    print(
        f"{args.tag}: removed (404 unknown_tag at every node within "
        f"IDPOOL_TAG_RELOAD_SECONDS); {sum(map(len, drained))} ready IDs in "
        f"{counted(len(drained), 'range')} wasted{kept}"
    )
    return 0
