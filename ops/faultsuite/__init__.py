"""Fault-injection suite: real idpool processes, Redis and MariaDB, faults, and an
account of every ID. Run it with ``ops/faults`` (see ops/README.md)."""

from .accounting import account
from .cluster import Run
from .faults import NODE_GONE, SCENARIOS
from .recorder import IdBitmap
from .runner import build_parser, run

__all__ = ["NODE_GONE", "SCENARIOS", "IdBitmap", "Run", "account", "build_parser", "run"]
