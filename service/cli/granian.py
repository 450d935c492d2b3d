"""``idpool serve --http granian``: the node's app on granian, with its bounds.

granian (a Rust HTTP server) parses HTTP/1 with a bounded buffer, closes a
connection whose request head has not arrived in time, and takes no more
connections per worker than its backpressure allows (the others wait in the
listen queue, unread). The hot routes answer through RSGI (service/rsgi.py).
"""

from __future__ import annotations

import argparse
import os

from idpool.pool.settings import Settings

from .logs import logging_config

# The access line: as uvicorn's, with the query (token= blanked by RedactTokens).
ACCESS_FORMAT = '%(addr)s - "%(method)s %(path)s%(query_string)s %(protocol)s" %(status)d'
GRACE_SECONDS = 30  # as uvicorn's timeout_graceful_shutdown: then a worker is killed


def granian_options(settings: Settings, workers: int) -> dict[str, object]:
    """The Server's keyword arguments for these settings (ops/bench uses them too)."""
    from granian.constants import HTTPModes, Interfaces, RuntimeModes
    from granian.http import HTTP1Settings

    seconds = settings.keep_alive_seconds
    return {
        "interface": Interfaces.RSGI,
        "workers": workers,
        # One Rust thread per worker, on a single-threaded runtime: the Python code is
        # the work, and more threads per worker than cores contend with it
        # (BENCHMARKS.md, "HTTP server").
        "runtime_threads": 1,
        "runtime_mode": RuntimeModes.st,
        "http": HTTPModes.http1,
        "websockets": False,
        # Connections served at once per worker; beyond it they wait, unaccepted.
        "backpressure": settings.max_connections,
        "http1_settings": HTTP1Settings(
            # one timer in granian: for a request's head, and for the idle wait before it
            header_read_timeout=max(1, round(1000 * min(settings.header_seconds, seconds))),
            keep_alive=True,
            max_buffer_size=settings.max_header_bytes,
        ),
        "workers_kill_timeout": GRACE_SECONDS,
        # A worker that dies (OOM kill, a crash) is started again, as uvicorn's
        # supervisor does: granian's default stopped the whole node instead. What
        # the dead worker held is a crash's waste; the new one starts empty.
        "respawn_failed_workers": True,
    }


def run_granian(settings: Settings, args: argparse.Namespace) -> None:
    from granian.log import LogLevels
    from granian.server import Server

    os.environ.setdefault("IDPOOL_HTTP", "granian")
    server = Server(
        "idpool.service.rsgi:create_rsgi_app",
        factory=True,
        address=args.host,
        port=args.port,
        log_level=LogLevels(args.log_level),
        log_dictconfig=logging_config(args.log_level, args.access_log),
        log_access=args.access_log,
        log_access_format=ACCESS_FORMAT,
        **granian_options(settings, args.workers),  # type: ignore[arg-type]
    )
    server.serve()
