"""ops/processes.py: the `idpool serve` processes the multi-process tests start."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis

from ops.toolkit import NodeProcess, env_with

from .conftest import MYSQL_URL, REDIS_URL, new_name


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ready")

    def log_message(self, *args: object) -> None:
        pass


def test_a_node_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    """Another process took the port and answers /readyz itself: the node, which
    could not listen, is started again on a fresh port, and only its own start
    counts as ready."""
    squatter = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    taken = squatter.server_address[1]
    prefix = new_name("idpp")
    env = env_with(
        IDPOOL_MYSQL_URL=MYSQL_URL,
        IDPOOL_REDIS_URL=REDIS_URL,
        IDPOOL_REDIS_PREFIX=prefix,
        IDPOOL_PRELOAD="0",
    )
    node = NodeProcess(env, tmp_path / "node", port=taken)
    try:
        node.start(ready_timeout=60)
        assert node.port != taken and len(node.logs) == 2
        assert b"cannot listen" in node.logs[0].read_bytes()
        assert b"event=node_started" in node.logs[1].read_bytes()
    finally:
        if node.proc is not None:
            node.stop()
        squatter.shutdown()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
