"""What every command group shares: exit codes, the options taken before or
after any subcommand, argument types, and how figures are printed."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from idpool.pool.errors import InvalidInput

from ..tag_fields import check_tag
from .logs import LOG_LEVELS

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_CANNOT_LISTEN = 4
EXIT_BROKEN_PIPE = 141  # as a command killed by SIGPIPE (128 + 13) says to a shell
EMBEDDED_FILE = "idpool.db"  # `--embedded` without a sqlite: IDPOOL_MYSQL_URL: in the working dir


def flag(field: str) -> str:
    """A tag field as the command line spells it (tag_fields' messages)."""
    return f"--{field.replace('_', '-')}"


def tag_arg(value: str) -> str:
    try:
        return check_tag(value)
    except InvalidInput as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def integer(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None


def port_number(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: use 1 to 65535")
    return number


def integer_up_to(top: int) -> Callable[[str], int]:
    """An argument type: an integer from 1 to ``top``."""

    def parse(value: str) -> int:
        number = integer(value)
        if not 1 <= number <= top:
            raise argparse.ArgumentTypeError(f"{value} must be from 1 to {top}")
        return number

    return parse


def checked(check: Callable[[int], int]) -> Callable[[str], int]:
    """An argument type: an integer that ``check`` (from tag_fields) accepts."""

    def parse(value: str) -> int:
        try:
            return check(integer(value))
        except InvalidInput as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def common_options(parser: argparse.ArgumentParser, default: object) -> None:
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


def show(value: object) -> str:
    return "-" if value is None else str(value)


def counted(n: int, noun: str) -> str:
    """``1 tag``, ``2 tags``, ``0 ranges``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
