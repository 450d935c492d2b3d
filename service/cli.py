"""The ``idpool`` command: serve, preload, tag add/list/step/start, pool show.

Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import logging.config
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import quote

from pool.claims import LedgerClaims, create_tag, move_start
from pool.errors import ConfigError, StartBelowIssued, StoreUnavailable, TagExists, UnknownTag
from pool.preloader import Preloader
from pool.ranges import MAX_ID, MAX_STEP, TAG_RULE, is_valid_tag
from pool.settings import Settings
from pool.stores import LedgerStore, open_ledger, open_pool, open_stores
from service.node import Node, RangeSource
from service.status import snapshot

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_CANNOT_LISTEN = 4
LOG_LEVELS = ("debug", "info", "warning", "error")
EMBEDDED_FILE = "idpool.db"  # `--embedded` without a sqlite: IDPOOL_MYSQL_URL: in the working dir


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
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "line",
                "stream": "ext://sys.stderr",
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
    _common_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)
    embedded = argparse.ArgumentParser(add_help=False)
    _common_options(embedded, argparse.SUPPRESS)

    serve = sub.add_parser(
        "serve", parents=[embedded], help="run a node (HTTP API; preloader inside by default)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="uvicorn workers; each is a node")
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
    tag.add_parser("list", parents=[embedded], help="list tags and their ledger position")
    step = tag.add_parser("step", parents=[embedded], help="change a tag's range size")
    step.add_argument("tag", type=_tag)
    step.add_argument("step", type=_integer(MAX_STEP))
    start = tag.add_parser(
        "start", parents=[embedded], help="move a tag's next ID forward (never back)"
    )
    start.add_argument("tag", type=_tag)
    start.add_argument("start", type=_integer(MAX_ID))

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
    # Fail here, once, with a clear message, rather than in every worker.
    _check_port(args.host, args.port)
    asyncio.run(_check_stores(settings))
    uvicorn.run(
        "service.app:create_app",
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
        except OSError as e:
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
        print(f"{'tag':<24} {'max_id':>20} {'step':>10} {'start':>12}  description")
        for row in await ledger.list_tags():
            print(
                f"{row.tag:<24} {row.max_id:>20} {row.step:>10} {row.start_id:>12}  "
                f"{row.description}"
            )
        return 0
    finally:
        await ledger.close()


async def _tag_add(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    step = args.step or settings.default_step
    # No check: with Redis down a tag can still be added (without its high-water mark).
    pool = await open_pool(settings, check=False)
    try:
        row = await create_tag(
            ledger, pool, args.tag, step=step, start=args.start, description=args.description
        )
    except TagExists:
        print(f"idpool: tag {args.tag!r} already exists (see `idpool tag list`)", file=sys.stderr)
        return EXIT_USAGE
    finally:
        await pool.close()
    note = ""
    if row.max_id > args.start:
        note = f" (IDs up to {row.max_id - 1} were issued before under this tag; starting after)"
    print(f"added {row.tag}: first ID {row.max_id}, step {row.step}{note}")
    return 0


async def _tag_start(settings: Settings, ledger: LedgerStore, args: argparse.Namespace) -> int:
    # No check: with Redis down the ledger's own max_id still refuses a start below it.
    pool = await open_pool(settings, check=False)
    try:
        row = await move_start(ledger, pool, args.tag, args.start)
    except UnknownTag:
        print(f"idpool: tag {args.tag!r} does not exist", file=sys.stderr)
        return EXIT_USAGE
    except StartBelowIssued as e:
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


def _show(value: object) -> str:
    return "-" if value is None else str(value)


if __name__ == "__main__":
    sys.exit(main())
