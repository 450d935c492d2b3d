"""The ``idpool`` command: serve, preload, tag add/list/step/start/disable/enable/remove,
tag token add/list/revoke, pool show, status.

One module per command group (``serve.py``, ``tag.py``, ``status.py``);
logging is configured here (from ``logs.py``) and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import logging.config
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import quote

from idpool.pool.errors import ConfigError, InvalidInput, StoreUnavailable
from idpool.pool.settings import Settings

from ..metrics import VERSION
from . import serve, status, tag
from .common import (
    EMBEDDED_FILE,
    EXIT_BROKEN_PIPE,
    EXIT_CANNOT_LISTEN,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    common_options,
)
from .logs import logging_config

Command = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]
_COMMANDS: dict[str, Command] = {
    "preload": serve.preload,
    "tag": tag.run,
    "pool": status.pool_show,
    "status": status.status,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idpool", description="Distributed 64-bit ID service")
    parser.add_argument("--version", action="version", version=f"idpool {VERSION}")
    common_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)
    embedded = argparse.ArgumentParser(add_help=False)
    common_options(embedded, argparse.SUPPRESS)
    serve.add_parsers(sub, embedded)
    tag.add_parsers(sub, embedded)
    status.add_parsers(sub, embedded)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.config.dictConfig(logging_config(args.log_level))
    try:
        settings = _choose_ledger(Settings.from_env(), args.embedded)
        if args.command == "serve":
            return serve.serve(settings, args)
        code = asyncio.run(_COMMANDS[args.command](settings, args))
        sys.stdout.flush()  # here, where a reader gone is caught, not at exit
        return code
    except ConfigError as e:
        print(f"idpool: configuration error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except InvalidInput as e:  # what a command did not refuse itself: no traceback
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `idpool tag list | head -1`: the reader left. Python's docs' recipe: point
        # stdout at devnull so the flush at exit cannot raise again, and exit quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except StoreUnavailable as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except serve.CannotListen as e:
        print(f"idpool: {e}", file=sys.stderr)
        return EXIT_CANNOT_LISTEN


def _choose_ledger(settings: Settings, embedded: bool) -> Settings:
    """``--embedded`` picks the SQLite ledger; it never overrides a MySQL URL the
    operator set, and nothing else ever picks it (no fallback when MySQL is down)."""
    if not embedded or settings.embedded:
        return settings
    if os.environ.get("IDPOOL_MYSQL_URL") or os.environ.get("IDPOOL_LEDGER_URL"):
        raise ConfigError(
            "--embedded and IDPOOL_MYSQL_URL name two different ledgers: unset "
            "IDPOOL_MYSQL_URL, or set it to sqlite:///path/to/idpool.db to choose the file"
        )
    return settings.with_changes(mysql_url="sqlite://" + quote(os.path.abspath(EMBEDDED_FILE)))
