"""The scale measurement behind ``ops/scale`` (issue 11): what idle tags and
extra nodes cost, whether idle tags slow a busy one, and whether the published
rate and the IDs claimed follow a low, steady consumption.

It drives real ``idpool serve`` processes of whatever code is installed in the
running Python, each scenario against a private redis-server and a fresh
database on the machine's MariaDB, and reads what it reports from ``/proc``,
Redis ``INFO`` and the ledger row, never from idpool's own modules: the same
probe measures the code before and after a rewrite.

``world.py`` starts and stops the stores and nodes, ``load.py`` drives HTTP
load, ``scenarios.py`` runs the three scenarios, ``run.py`` is the command line.
"""

from .run import parse
from .world import cpu_percent, thread_cpu_ns

__all__ = ["cpu_percent", "parse", "thread_cpu_ns"]
