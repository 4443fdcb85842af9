"""``supervisor.log_fields(**fields)``: an actor adds fields to its job's log line.

The worker's JobLog (``supervisor/worker/joblog.py``) writes one line per finished
job; the fields an actor gave during that attempt join it, as ``key=value`` in text
logs and as keys of the JSON line. They are kept per job id in this process only
while a JobLog collects them (``collecting``), so a process without the job log
(``job_log: false``, or a plain dramatiq worker) keeps nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.middleware import CurrentMessage

# What a job line already carries, and what logging itself reserves: a field may not
# shadow either (logging raises on the latter; the former would lie).
RESERVED = frozenset({"job_id", "actor", "queue", "role", "duration_ms", "outcome", "error", "pid", "ts", "level",
                      "logger", "msg", "exc"}) | frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# A job that adds fields in a loop keeps the latest value of at most this many keys.
MAX_FIELDS = 32

_fields: dict[str, dict[str, Any]] = {}
collecting = False


def log_fields(**fields: Any) -> None:
    """Add ``fields`` to the current job's log line (later calls add or replace keys).

    Outside a job, or where no job log is written, it does nothing. A name that the
    line already uses (``job_id``, ``actor``, ...) raises ValueError."""
    bad = sorted(k for k in fields if k in RESERVED)
    if bad:
        raise ValueError(f"log_fields: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} reserved by the job's "
                         "log line; choose another name")
    if not collecting:
        return
    current = CurrentMessage.get_current_message()
    if current is None:
        return
    held = _fields.setdefault(current.message_id, {})
    for key, value in fields.items():
        if key in held or len(held) < MAX_FIELDS:
            held[key] = value


def take(job_id: str) -> dict[str, Any]:
    """The fields the job's attempt gave, forgotten here (called once per finished attempt)."""
    return _fields.pop(job_id, None) or {}
