"""Logging for every idpool process: one dictConfig, and token redaction.

Configured only by the CLI (``idpool ...``), here; the library modules log
through their own loggers and never configure anything.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote_plus

LOG_LEVELS = ("debug", "info", "warning", "error")

# `;` too: Starlette does not split on it, but a client that does sends its token after one.
_QUERY_PARAMETER = re.compile(r"([?&;])([^=&;\s\"]*)=([^&;\s\"]*)")


def redact(text: str) -> str:
    """Blank the value of every query parameter named ``token`` however its name is
    spelled on the wire (``%74oken`` is ``token`` to Starlette too)."""

    def blank(m: re.Match[str]) -> str:
        if unquote_plus(m.group(2)).lower() != "token":
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}=[redacted]"

    return _QUERY_PARAMETER.sub(blank, text) if "=" in text else text


class RedactTokens(logging.Filter):
    """Blank ``token`` query parameters in every line (uvicorn's access log
    writes the full path, granian's the query apart): a tag's token must never
    reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):  # granian's access line: one mapping
            query = record.args.get("query_string")
            if isinstance(query, str):  # shown with its "?" when there is one
                record.args = {**record.args, "query_string": query and redact(f"?{query}")}
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def logging_config(level: str, access_log: bool = False) -> dict[str, Any]:
    """dictConfig for this process and every uvicorn worker (workers are spawned
    processes: they configure logging from this, not from the parent's state).

    uvicorn writes access lines at INFO: with ``--access-log`` they are kept
    whatever ``--log-level`` says, rather than silently dropped at ``warning``.
    """
    loggers: dict[str, Any] = {
        # one line per job run is noise; idpool logs what each tick did
        "apscheduler": {"level": "ERROR"},
    }
    if access_log:
        loggers["uvicorn.access"] = {"level": "INFO"}
        loggers["granian.access"] = {"level": "INFO"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "line": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"}
        },
        "filters": {"redact_tokens": {"()": f"{__name__}.RedactTokens"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "line",
                "stream": "ext://sys.stderr",
                "filters": ["redact_tokens"],
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": loggers,
    }
