"""A drain of the node, seen by every worker of it.

``idpool serve --workers N`` runs N processes behind one port; ``POST
/admin/drain`` reaches one of them. That one makes a flag file which
``idpool serve`` named for this run (``IDPOOL_DRAIN_FILE``, in a directory of its
own, removed when it stops); every worker looks for it ten times a second and
drains itself when it appears, and ``/readyz`` looks at it on each probe, so no
worker answers ready after the drain. A file is the simplest mechanism both
servers (uvicorn, granian) leave room for: their supervisors pass no messages
between workers, and the embedded mode has no Redis.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from idpool.pool.clock import SYSTEM_CLOCK, Clock

ENV = "IDPOOL_DRAIN_FILE"
LOOK_EVERY = 0.1  # seconds between a worker's looks for the flag


class DrainFlag:
    """The node's drain flag: raised once, never lowered (a drained node is stopped)."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def from_env(cls) -> DrainFlag | None:
        path = os.environ.get(ENV, "")
        return cls(path) if path else None

    def raise_(self) -> None:
        with open(self.path, "a"):
            pass

    def raised(self) -> bool:
        return os.path.exists(self.path)

    async def watch(
        self,
        is_draining: Callable[[], bool],
        drain: Callable[[], Awaitable[object]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """Drain this worker once another raised the flag (looking on ``clock``, the
        runtime's)."""
        while not self.raised():  # noqa: ASYNC110 (a file has no event to wait on)
            await clock.sleep(LOOK_EVERY)
        # A worker that looked just before the flag was made serves on until its next
        # look (0.1 s): IDs from its own buffer, never another's; then it drains as
        # the first did. A drain under way already (its own request, or the stop)
        # is not started twice: Node.shutdown returns the first call's report.
        if not is_draining():
            await drain()


@contextmanager
def drain_flag_file() -> Iterator[str]:
    """Name this run's flag for its workers (a new one each run: a drain of the
    last run does not drain the next); removed with its directory at the end."""
    _remove_orphans()
    directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
    path = os.environ[ENV] = os.path.join(directory, "drain")
    try:
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


_PREFIX = "idpool-drain-"


def _remove_orphans() -> None:
    """Remove the flag directories of runs that ended without removing theirs (kill -9):
    their names carry the run's PID, and no live process has it (or it is another's,
    which only keeps the directory a while longer)."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if name.startswith(_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
