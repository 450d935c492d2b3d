"""One HTTP attempt at a node for IDs, on a kept-alive connection: the part the
load clients of the fault suite (``faultsuite/recorder.py``) and the rolling
restart (``rolling_restart.py``) share. Each decides its own retries, pacing
and tallies around it.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass


@dataclass
class Answer:
    status: str  # "200", "503 unavailable", or the exception's name (no answer)
    ids: list[int] | None  # the IDs, on a 200
    message: str = ""  # the error body's message, when there was one
    seconds: float = 0.0  # how long the attempt took


class NodeConnections:
    """One kept-alive connection per node address; a connection idle longer than
    ``idle_reuse`` seconds is opened afresh (None: always reused)."""

    def __init__(self, timeout: float, idle_reuse: float | None = None) -> None:
        self.timeout = timeout
        self.idle_reuse = idle_reuse
        self._conns: dict[str, tuple[http.client.HTTPConnection, float]] = {}

    def get_ids(self, address: str, path: str) -> Answer:
        """GET ``path`` (``/id/{tag}`` or ``/ids/{tag}?count=N``) at ``host:port``."""
        started = time.monotonic()
        conn, last_used = self._conns.get(address, (None, 0.0))
        if (
            conn is not None
            and self.idle_reuse is not None
            and started - last_used > self.idle_reuse
        ):
            conn.close()
            conn = None
        if conn is None:
            host, _, port = address.removeprefix("http://").rpartition(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=self.timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            self._conns.pop(address, None)
            return Answer(type(e).__name__, None, seconds=time.monotonic() - started)
        took = time.monotonic() - started
        self._conns[address] = (conn, time.monotonic())
        if resp.status != 200:
            try:
                error = json.loads(body)
                code, message = str(error.get("error", "")), str(error.get("message", ""))
            except (ValueError, AttributeError):
                code, message = "", body[:200].decode(errors="replace")
            return Answer(f"{resp.status} {code}".strip(), None, message, took)
        single = path.startswith("/id/")
        return Answer("200", [int(body)] if single else list(json.loads(body)["ids"]), "", took)

    def close(self) -> None:
        for conn, _ in self._conns.values():
            conn.close()
        self._conns.clear()
