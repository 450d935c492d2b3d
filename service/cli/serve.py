"""``idpool serve`` (a node: the HTTP API, the preloader inside by default) and
``idpool preload`` (the preloader alone)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket

from idpool.pool.errors import ConfigError
from idpool.pool.preloader import Preloader
from idpool.pool.settings import HTTP_SERVERS, Settings
from idpool.pool.stores import open_stores

from ..drain import drain_flag_file
from ..kinds import rules_of
from .common import integer_up_to, port_number
from .granian import run_granian
from .logs import logging_config


class CannotListen(Exception):
    """The address to serve on cannot be bound (in use, or not this machine's)."""


def add_parsers(sub: argparse._SubParsersAction, embedded: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    serve = sub.add_parser(
        "serve", parents=[embedded], help="run a node (HTTP API; preloader inside by default)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=port_number, default=8000)
    serve.add_argument(
        "--workers", type=integer_up_to(1024), default=1, help="worker processes; each is a node"
    )
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.add_argument(
        "--http",
        choices=HTTP_SERVERS,
        default=None,
        help="the HTTP server (default: IDPOOL_HTTP, else granian; README, 'HTTP server')",
    )
    sub.add_parser(
        "preload", parents=[embedded], help="run the preloader alone, until SIGTERM or Ctrl-C"
    )


def serve(settings: Settings, args: argparse.Namespace) -> int:
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
    server = args.http or settings.http
    settings = settings.with_changes(max_connections=connection_cap(settings.max_connections))
    # Every worker reads it: a drain on one is a drain of the node (service/drain.py).
    with drain_flag_file():
        if server == "granian":
            run_granian(settings, args)
        else:
            run_uvicorn(settings, args)
    return 0


def run_uvicorn(settings: Settings, args: argparse.Namespace) -> None:
    import uvicorn

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
        # The bounds uvicorn has (README, "HTTP server", says what it cannot bound):
        # connections beyond the cap are answered 503, idle ones closed.
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=max(1, round(settings.keep_alive_seconds)),
    )


def connection_cap(wanted: int) -> int:
    """IDPOOL_MAX_CONNECTIONS, below this process's open-file limit (each worker has
    its own): a worker that ran out of descriptors failed every new request."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    # room for the stores' connections, the log, the listening socket
    return max(1, min(wanted, soft - _FILES_KEPT))


_FILES_KEPT = 128  # descriptors a worker keeps for other than client connections


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
    ledger, pool = await open_stores(settings)
    await pool.close()
    await ledger.close()


async def preload(settings: Settings, args: argparse.Namespace) -> int:
    ledger, pool = await open_stores(settings)
    try:
        preloader = Preloader(settings, ledger, pool, rules_of=rules_of)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        preloader.start()
        logging.getLogger("idpool.cli").info("event=preloader_started owner=%s", preloader.owner)
        await stop.wait()
        await preloader.close()
    finally:
        await pool.close()
        await ledger.close()
    return 0
