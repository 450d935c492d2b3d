"""idpool's Python client: IDs handed out in-process from ranges leased from idpool.

The guarantee is idpool's: no ID twice, across threads, processes and node
restarts. A client leases whole ranges (``POST /lease/{tag}``), serves
``next_id`` from memory (no network call, no lock on the hot path), fetches the
next range in the background before the current one runs out, and on
``close()`` (or at interpreter exit) returns each unused tail once
(``POST /lease/return``). A client killed with ``kill -9`` loses only the
ranges it held; one that cannot reach any node keeps serving what it holds,
then raises ``IdPoolUnavailable``.

    from idpool_client import IdPoolClient
    with IdPoolClient(["http://10.0.0.1:8000"], tokens={"orders": ORDERS_TOKEN}) as ids:
        order_id = ids.next_id("orders")
"""

from __future__ import annotations

from .aio import AsyncIdPoolClient
from .errors import (
    IdPoolAuthError,
    IdPoolClosed,
    IdPoolError,
    IdPoolRequestError,
    IdPoolStrictTag,
    IdPoolUnavailable,
)
from .holding import CloseReport
from .sync import IdPoolClient
from .transport import Lease

__version__ = "0.2.0"

__all__ = [
    "AsyncIdPoolClient",
    "CloseReport",
    "IdPoolAuthError",
    "IdPoolClient",
    "IdPoolClosed",
    "IdPoolError",
    "IdPoolRequestError",
    "IdPoolStrictTag",
    "IdPoolUnavailable",
    "Lease",
    "__version__",
]
