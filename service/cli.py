"""The ``idpool`` command: serve, preload, tag add/list/step/start/disable/enable/remove,
tag token add/list/revoke, pool show, status.

Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import logging.config
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import quote, unquote_plus

from idpool.pool.claims import LedgerClaims, create_tag, disable_tag, enable_tag, move_start
from idpool.pool.errors import (
    ConfigError,
    StartAboveMax,
    StartBelowIssued,
    StoreUnavailable,
    TagExists,
    UnknownTag,
)
from idpool.pool.ledger import TagRow
from idpool.pool.preloader import Preloader
from idpool.pool.ranges import MAX_ID, MAX_STEP, TAG_RULE, is_valid_tag
from idpool.pool.settings import Settings
from idpool.pool.stores import LedgerStore, open_ledger, open_pool, open_stores
from idpool.pool.tokens import hash_token, new_token
from idpool.service.metrics import VERSION
from idpool.service.node import Node, RangeSource, node_ttl
from idpool.service.status import cluster, read_stores, runway_seconds, runway_text, snapshot

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_CANNOT_LISTEN = 4
LOG_LEVELS = ("debug", "info", "warning", "error")
EMBEDDED_FILE = "idpool.db"  # `--embedded` without a sqlite: IDPOOL_MYSQL_URL: in the working dir


# `;` too: Starlette does not split on it, but a client that does sends its token after one.
_QUERY_PARAMETER = re.compile(r"([?&;])([^=&;\s\"]*)=([^&;\s\"]*)")


def _redact(text: str) -> str:
    """Blank the value of every query parameter named ``token`` however its name is
    spelled on the wire (``%74oken`` is ``token`` to Starlette too)."""

    def blank(m: re.Match[str]) -> str:
        if unquote_plus(m.group(2)).lower() != "token":
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}=[redacted]"

    return _QUERY_PARAMETER.sub(blank, text) if "=" in text else text


class RedactTokens(logging.Filter):
    """Blank ``token`` query parameters in every line (uvicorn's access log
    writes the full path): a tag's token must never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = _redact(record.msg)
        return True


def logging_config(level: str, access_log: bool = False) -> dict[str, Any]:
    """dictConfig for this process and every uvicorn worker (workers are spawned
    processes: they configure logging from this, not from the parent's state).

    uvicorn writes access lines at INFO: with ``--access-log`` they are kept
    whatever ``--log-level`` says, rather than silently dropped at ``warning``.
    """
    loggers: dict[str, Any] = {
        # one line per job run is noise; idpool logs what each tick did
        "apscheduler": {"level": "ERROR"},
    }
    if access_log:
        loggers["uvicorn.access"] = {"level": "INFO"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "line": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"}
        },
        "filters": {"redact_tokens": {"()": "idpool.service.cli.RedactTokens"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "line",
                "stream": "ext://sys.stderr",
                "filters": ["redact_tokens"],
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": loggers,
    }


def _tag(value: str) -> str:
    if not is_valid_tag(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a valid tag: use {TAG_RULE}")
    return value


def _integer(top: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if not 1 <= number <= top:
            raise argparse.ArgumentTypeError(f"{value} must be from 1 to {top}")
        return number

    return parse


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: use 1 to 65535")
    return number


def _common_options(parser: argparse.ArgumentParser, default: object) -> None:
    """--log-level and --embedded, taken before or after the subcommand.

    On subcommands the default is SUPPRESS, so a value given before the
    subcommand is not overwritten by the subparser's default.
    """
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=default if default is argparse.SUPPRESS else "info",
        help="debug, info, warning or error (default info)",
    )
    parser.add_argument(
        "--embedded",
        action="store_true",
        default=default if default is argparse.SUPPRESS else False,
        help=f"use the embedded ledger and pool (SQLite file ./{EMBEDDED_FILE}, or the one a "
        "sqlite:///path IDPOOL_MYSQL_URL names): one node, no MySQL or Redis",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idpool", description="Distributed 64-bit ID service")
    parser.add_argument("--version", action="version", version=f"idpool {VERSION}")
    _common_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)
    embedded = argparse.ArgumentParser(add_help=False)
    _common_options(embedded, argparse.SUPPRESS)

    serve = sub.add_parser(
        "serve", parents=[embedded], help="run a node (HTTP API; preloader inside by default)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument(
        "--workers", type=_integer(1024), default=1, help="uvicorn workers; each is a node"
    )
    serve.add_argument("--access-log", action="store_true", help="log every request")

    sub.add_parser(
        "preload", parents=[embedded], help="run the preloader alone, until SIGTERM or Ctrl-C"
    )

    tag = sub.add_parser("tag", help="manage tags").add_subparsers(
        dest="tag_command", required=True
    )
    add = tag.add_parser("add", parents=[embedded], help="create a tag")
    add.add_argument("tag", type=_tag)
    add.add_argument("--step", type=_integer(MAX_STEP), default=None, help="IDs per range")
    add.add_argument("--start", type=_integer(MAX_ID), default=1, help="first ID (default 1)")
    add.add_argument("--description", default="")
    add.add_argument(
        "--max",
        type=_integer(MAX_ID - 1),
        default=None,
        help="highest ID the tag may hand out, e.g. 9007199254740991 to stay exact in "
        "JavaScript (default: no bound below 2^63)",
    )
    tag.add_parser(
        "list", parents=[embedded], help="list tags: ledger position, bound, runway, state"
    )
    for verb, what in (
        ("disable", "stop serving a tag (410 tag_disabled); its ready ranges become waste"),
        ("enable", "serve a disabled tag again, from fresh ranges"),
    ):
        toggle = tag.add_parser(verb, parents=[embedded], help=what)
        toggle.add_argument("tag", type=_tag)
    token = tag.add_parser("token", help="a tag's tokens").add_subparsers(
        dest="token_command", required=True
    )
    token_add = token.add_parser(
        "add", parents=[embedded], help="make a token; from then on the tag needs one"
    )
    token_add.add_argument("tag", type=_tag)
    token_list = token.add_parser("list", parents=[embedded], help="a tag's token ids")
    token_list.add_argument("tag", type=_tag)
    revoke = token.add_parser("revoke", parents=[embedded], help="delete one token")
    revoke.add_argument("tag", type=_tag)
    revoke.add_argument("token_id")
    step = tag.add_parser("step", parents=[embedded], help="change a tag's range size")
    step.add_argument("tag", type=_tag)
    step.add_argument("step", type=_integer(MAX_STEP))
    remove = tag.add_parser(
        "remove",
        parents=[embedded],
        help="delete a tag for good: 404 unknown_tag, tokens dropped, ready ranges wasted; "
        "the name added again starts above every ID it issued",
    )
    remove.add_argument("tag", type=_tag)
    remove.add_argument("--yes", action="store_true", help="do it (without: say what it does)")
    start = tag.add_parser(
        "start", parents=[embedded], help="move a tag's next ID forward (never back)"
    )
    start.add_argument("tag", type=_tag)
    start.add_argument("start", type=_integer(MAX_ID))

    sub.add_parser(
        "status", parents=[embedded], help="the cluster: live nodes, and per tag its supply"
    )

    pool = sub.add_parser("pool", help="inspect the Redis pool").add_subparsers(
        dest="pool_command", required=True
    )
    pool.add_parser("show", parents=[embedded], help="depth and head range per tag")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.config.dictConfig(logging_config(args.log_level))
    try:
        settings = _choose_ledger(Settings.from_env(), args.embedded)
        if args.command == "serve":
            return _serve(settings, args)
        commands: dict[str, Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]] = {
            "preload": _preload,
            "tag": _tag_command,
            "pool": _pool_show,
            "status": _status,
        }
        return asyncio.run(commands[args.command](settings, args))
    except ConfigError as e:
        print(f"idpool: configuration error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except StoreUnavailable as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except CannotListen as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_CANNOT_LISTEN


def _choose_ledger(settings: Settings, embedded: bool) -> Settings:
    """``--embedded`` picks the SQLite ledger; it never overrides a MySQL URL the
    operator set, and nothing else ever picks it (no fallback when MySQL is down)."""
    if not embedded or settings.embedded:
        return settings
    if os.environ.get("IDPOOL_MYSQL_URL"):
        raise ConfigError(
            "--embedded and IDPOOL_MYSQL_URL name two different ledgers: unset "
            "IDPOOL_MYSQL_URL, or set it to sqlite:///path/to/idpool.db to choose the file"
        )
    return settings.with_changes(mysql_url="sqlite://" + quote(os.path.abspath(EMBEDDED_FILE)))


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    if settings.embedded:
        if args.workers != 1:
            raise ConfigError(
                f"--workers {args.workers}: the embedded mode runs one node in one process; "
                "drop --workers, or run MySQL and Redis for several nodes"
            )
        # The app factory reads the environment: hand it the ledger chosen here.
        os.environ["IDPOOL_MYSQL_URL"] = settings.mysql_url
    # The workers read their settings from the environment: the cluster view's address.
    os.environ.setdefault("IDPOOL_ADVERTISE", f"{args.host}:{args.port}")
    # Fail here, once, with a clear message, rather than in every worker.
    _check_port(args.host, args.port)
    asyncio.run(_check_stores(settings))
    uvicorn.run(
        "idpool.service.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        access_log=args.access_log,
        log_config=logging_config(args.log_level, args.access_log),
        lifespan="on",
        timeout_graceful_shutdown=30,
    )
    return 0


class CannotListen(Exception):
    """The address to serve on cannot be bound (in use, or not this machine's)."""


def _check_port(host: str, port: int) -> None:
    """Bind the address once, as uvicorn will, so a port in use is said plainly
    rather than as a startup traceback with uvicorn's exit code."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn sets it
        try:
            sock.bind((host, port))
        except (socket.gaierror, UnicodeError):
            # not an address, and no name that resolves: the host is wrong, not the port
            raise CannotListen(
                f"cannot listen on {host}:{port}: {host!r} is not an address or host name "
                "of this machine; choose another --host (e.g. 127.0.0.1 or 0.0.0.0)"
            ) from None
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise CannotListen(
                    f"cannot listen on {host}:{port}: {e.strerror}: {host} is not an address "
                    "of this machine; choose another --host (e.g. 127.0.0.1 or 0.0.0.0)"
                ) from None
            raise CannotListen(
                f"cannot listen on {host}:{port}: {e.strerror}; "
                "stop what uses it or choose another --port"
            ) from None


async def _check_stores(settings: Settings) -> None:
    ledger, redis_pool = await open_stores(settings)
    await redis_pool.close()
    await ledger.close()


async def _preload(settings: Settings, args: argparse.Namespace) -> int:
    ledger, redis_pool = await open_stores(settings)
    try:
        preloader = Preloader(settings, ledger, redis_pool)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        preloader.start()
        logging.getLogger("idpool.cli").info("event=preloader_started owner=%s", preloader.owner)
        await stop.wait()
        await preloader.close()
    finally:
        await redis_pool.close()
        await ledger.close()
    return 0


async def _tag_command(settings: Settings, args: argparse.Namespace) -> int:
    ledger = await open_ledger(settings)
    try:
        if args.tag_command == "add":
            return await _tag_add(settings, ledger, args)
        if args.tag_command == "step":
            try:
                row = await ledger.set_step(args.tag, args.step)
            except UnknownTag:
                print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
                return EXIT_USAGE
            print(f"{row.tag}: step is now {row.step}; ranges already claimed keep their size")
            return 0
        if args.tag_command == "start":
            return await _tag_start(settings, ledger, args)
        if args.tag_command in ("disable", "enable"):
            return await _tag_toggle(settings, ledger, args)
        if args.tag_command == "remove":
            return await _tag_remove(settings, ledger, args)
        if args.tag_command == "token":
            return await _tag_token(ledger, args)
        return await _tag_list(settings, ledger)
    finally:
        await ledger.close()


async def _tag_list(settings: Settings, ledger: LedgerStore) -> int:
    rows = await ledger.list_tags()
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
    for row in rows:
        found = pooled.get(row.tag)
        rate = float(found.stats["rate"]) if found and "rate" in found.stats else None
        runway = runway_seconds(row, found.ids if found else 0, rate)
        print(
            f"{row.tag:<24} {row.max_id:>20} {row.step:>10} {row.start_id:>12} "
            f"{_show(row.max):>20} {runway_text(runway, row.max is not None, ''):>10} "
            f"{'disabled' if row.disabled else 'enabled':>8}  {row.description}"
        )
    return 0


async def _tag_token(ledger: LedgerStore, args: argparse.Namespace) -> int:
    try:
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
    except UnknownTag:
        print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    if not rows:
        print(f"{args.tag}: no tokens; served to anyone")
    for row in rows:
        print(f"{row.token_id}  created {row.created_at:%Y-%m-%d %H:%M:%S}")
    return 0


async def _tag_toggle(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    log = logging.getLogger("idpool.cli")
    try:
        if args.tag_command == "enable":
            row = await enable_tag(ledger, args.tag)
            print(f"{row.tag}: enabled; the next range claimed starts at {row.max_id}")
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
    except UnknownTag:
        print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    ids = sum(map(len, drained))
    if drained:
        log.warning(
            "event=range_abandoned tag=%s range=%s reason=tag_disabled",
            row.tag,
            ",".join(r.to_text() for r in drained),
        )
    print(
        f"{row.tag}: disabled (410 tag_disabled at every node within "
        f"IDPOOL_TAG_RELOAD_SECONDS); {ids} ready IDs in {len(drained)} ranges wasted; "
        f"max_id {row.max_id} is kept"
    )
    return 0


async def _tag_remove(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    if not args.yes:
        try:
            row = await ledger.get_tag(args.tag)
        except UnknownTag:
            print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
            return EXIT_USAGE
        print(
            f"idpool: this removes {row.tag} for good: requests get 404 unknown_tag, its "
            "tokens are dropped, its ready ranges are wasted, and the name added again starts "
            f"at {row.max_id} or above; run again with --yes to remove it",
            file=sys.stderr,
        )
        return EXIT_USAGE
    removed: TagRow | None = None
    with contextlib.suppress(UnknownTag):  # removed before: its list may still need draining
        removed = await ledger.remove_tag(args.tag)
    pool = await open_pool(settings, check=False)
    try:
        drained = await pool.drain(args.tag)
    except StoreUnavailable as e:
        if removed is None:
            raise
        print(
            f"idpool: {args.tag!r} is removed, but its ready ranges could not be taken out of "
            f"the pool ({e}); run the command again",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    finally:
        await pool.close()
    if removed is None and not drained:
        print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    ids = sum(map(len, drained))
    if drained:
        logging.getLogger("idpool.cli").warning(
            "event=range_abandoned tag=%s range=%s reason=tag_removed",
            args.tag,
            ",".join(r.to_text() for r in drained),
        )
    kept = "" if removed is None else f"; added again it starts at {removed.max_id} or above"
    print(
        f"{args.tag}: removed (404 unknown_tag at every node within "
        f"IDPOOL_TAG_RELOAD_SECONDS); {ids} ready IDs in {len(drained)} ranges wasted{kept}"
    )
    return 0


async def _tag_add(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    step = args.step or settings.default_step
    if args.max is not None and args.max < args.start:
        print(f"idpool: --max {args.max} is below --start {args.start}", file=sys.stderr)
        return EXIT_USAGE
    # No check: with Redis down a tag can still be added (without its high-water mark).
    pool = await open_pool(settings, check=False)
    try:
        row = await create_tag(
            ledger,
            pool,
            args.tag,
            step=step,
            start=args.start,
            description=args.description,
            end_id=MAX_ID if args.max is None else args.max + 1,
        )
    except TagExists:
        print(f"idpool: tag {args.tag!r} already exists (see `idpool tag list`)", file=sys.stderr)
        return EXIT_USAGE
    finally:
        await pool.close()
    note = ""
    if row.max_id > args.start:
        note = f" (IDs up to {row.max_id - 1} were issued before under this tag; starting after)"
    bound = "" if row.max is None else f", max {row.max}"
    print(f"added {row.tag}: first ID {row.max_id}, step {row.step}{bound}{note}")
    return 0


async def _tag_start(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    # No check: with Redis down the ledger's own max_id still refuses a start below it.
    pool = await open_pool(settings, check=False)
    try:
        row = await move_start(ledger, pool, args.tag, args.start)
    except UnknownTag:
        print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    except (StartBelowIssued, StartAboveMax) as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        await pool.close()
    print(
        f"{row.tag}: the next range claimed starts at {row.max_id}; "
        "ranges already in the pool or in nodes are served first"
    )
    return 0


async def _pool_show(settings: Settings, args: argparse.Namespace) -> int:
    """The per-tag part of /status, from the stores (no node's buffers here)."""
    ledger, redis_pool = await open_stores(settings)
    try:
        idle = Node(RangeSource(LedgerClaims(ledger, redis_pool), redis_pool), prefetch_at=0.1)
        names = [row.tag for row in await ledger.list_tags()]
        snap = await snapshot(idle, ledger, redis_pool, tags=names)
    finally:
        await redis_pool.close()
        await ledger.close()
    print(
        f"{'tag':<20} {'step':>9} {'max_id':>14} {'depth':>6} {'target':>6} {'pool IDs':>12} "
        f"{'IDs/s':>9} {'minutes':>8}  head range"
    )
    for t in snap["tags"]:
        pool = t["pool"] or {}
        rate = t["rate"].get("cluster_ids_per_s")
        print(
            f"{t['tag']:<20} {_show(t['step']):>9} {_show(t['max_id']):>14} "
            f"{_show(pool.get('depth')):>6} {_show(pool.get('target_depth')):>6} "
            f"{_show(pool.get('ids')):>12} {_show(rate):>9} "
            f"{_show(pool.get('minutes_of_supply')):>8}  {_show(pool.get('head'))}"
        )
    return 0


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    """The cluster view of /status, in a terminal."""
    ledger, pool = await open_stores(settings)
    try:
        names = [row.tag for row in await ledger.list_tags()]
        view = await read_stores(ledger, pool, names, node_ttl(settings.report_seconds))
    finally:
        await pool.close()
        await ledger.close()
    shown = cluster(view)
    for store, detail in view.errors.items():
        print(f"! {store} down: {detail}")
    print(f"{len(shown['nodes'])} live nodes (as of {time.strftime('%Y-%m-%d %H:%M:%S')})")
    print(f"  {'node':<24} {'pid':>8} {'version':>8} {'seen':>6} {'tags':>5}  state")
    for n in shown["nodes"]:
        state = ", ".join(n["problems"]) or "serving"
        print(
            f"  {_show(n['addr']):<24} {_show(n['pid']):>8} {_show(n['version']):>8} "
            f"{n['last_seen_s']:>5}s {n['tags']:>5}  {state}"
        )
    print(
        f"  {'tag':<20} {'max_id':>14} {'max':>16} {'ranges':>9} {'minutes':>8} {'IDs/s':>9} "
        f"{'returned':>9} {'runway':>9}  wasted / state"
    )
    for t in shown["tags"]:
        ranges = "-" if t["depth"] is None else f"{t['depth']}/{t['target_depth'] or '-'}"
        wasted = " ".join(f"{reason}={ids}" for reason, ids in sorted(t["wasted"].items()))
        bounded = t["max"] is not None or t["max_id"] is None  # no row: not known
        state = ", ".join(t["problems"])
        print(
            f"  {t['tag']:<20} {_show(t['max_id']):>14} {_show(t['max']):>16} {ranges:>9} "
            f"{_show(t['minutes_of_supply']):>8} {_show(t['ids_per_s']):>9} "
            f"{t['returned']:>9} {runway_text(t['runway_s'], bounded, ''):>9}"
            f"  {wasted or '-'}"
            + (f"  [{state}]" if state else "")
        )
    if len(names) > len(shown["tags"]):
        print(f"  ... and {len(names) - len(shown['tags'])} more tags (idpool tag list)")
    return 0


def _show(value: object) -> str:
    return "-" if value is None else str(value)


if __name__ == "__main__":
    sys.exit(main())
