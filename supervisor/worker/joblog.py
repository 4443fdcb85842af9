"""One log line per finished job: id, actor, queue, role, pid, duration, outcome,
and the fields the actor added with ``supervisor.log_fields()`` (below: kept per job id in
this process only while a JobLog collects them, so a process without the job log,
``job_log: false`` or a plain dramatiq worker, keeps nothing).

With ``log_json`` every field is a key of the JSON line (``pid`` is on every
line already, see ``supervisor.logs``),
so a log pipeline can count outcomes and durations without parsing text.

The job's thread only notes what the line says (a tuple on a deque); the line is
made and written off that thread, by ``lines.LineWriter``, in batches: one write per
stream per batch instead of a record, a handler lock and a write per job. Written
inline, the line cost ~40 % of no-op throughput (bench/README.md, "The per-job log
line"), most of it the write: each one gives up the GIL and takes it back among the
busy job threads. The record keeps the job's clock (``created``), so a line says when
the job ended even though it is written up to ``lines.INTERVAL`` later.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, ClassVar

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import CurrentMessage, Middleware, Retries

from ..broker.consuming.order import Before, Placement
from .lines import LineWriter

log = logging.getLogger("supervisor.jobs")
LINE = "job %s %s queue=%s role=%s pid=%d %sms %s%s%s"

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


# What the job's thread notes: when it ended, then the line's own fields.
Noted = tuple[float, str, str, str, "float | None", str, "str | None", dict[str, Any], "dict[str, str] | None"]


class JobLog(Middleware):
    """One line per finished job, with the outcome Retries chose."""

    placement: ClassVar[Placement] = Before(
        Retries, "its after hooks must run after Retries', which chooses the outcome it logs")

    def __init__(self, role: str) -> None:
        self.role = role
        self.pid = os.getpid()
        self._started = threading.local()  # a message is processed on one worker thread
        self.writer = LineWriter(log, self._record)
        self._template: dict[str, Any] | None = None  # see _record
        global collecting
        collecting = True  # supervisor.log_fields() keeps what actors add from now on

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started.at = time.monotonic()

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        outcome = "succeeded" if exception is None else "failed" if message.failed else "retried"
        self._note(message, outcome, exception)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._note(message, "failed" if message.failed else "skipped", None)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self.writer.stop()  # the lines of the last jobs are written before the process goes

    def _note(self, message: MessageProxy, outcome: str, exception: BaseException | None) -> None:
        started = getattr(self._started, "at", None)
        self._started.at = None
        if not log.isEnabledFor(logging.INFO):
            take(message.message_id)
            return
        duration_ms = round((time.monotonic() - started) * 1000, 1) if started is not None else None
        # The exception is read now: it is cleared once the attempt is settled.
        error = f"{type(exception).__name__}: {exception}" if exception is not None else None
        self.writer.put((time.time(), message.message_id, message.actor_name, message.queue_name, duration_ms,
                         outcome, error, take(message.message_id), trace_ids(message)))

    def _record(self, noted: Noted) -> logging.LogRecord:
        """The record the line is (run by the writer's thread)."""
        at, job_id, actor, queue, duration_ms, outcome, error, added, ids = noted
        fields: dict[str, Any] = {"job_id": job_id, "actor": actor, "queue": queue, "role": self.role,
                                  "duration_ms": duration_ms, "outcome": outcome}
        if error is not None:
            fields["error"] = error
        fields.update(added)
        if ids:
            fields.update(ids)
        # What makeRecord would make, from a record made once on this (the writer's) thread:
        # only the line's own attributes differ (LogRecord's constructor looks up the
        # thread, process and more, a third of the line's cost).
        template = self._template
        if template is None:
            template = self._template = vars(log.makeRecord(log.name, logging.INFO, __file__, 0, LINE, (), None))
        record = logging.LogRecord.__new__(logging.LogRecord)
        attributes = record.__dict__
        attributes.update(template)
        attributes["args"] = (job_id, actor, queue, self.role, self.pid, duration_ms, outcome,
                              "".join(f" {k}={v}" for k, v in added.items()),
                              f" ({error})" if error is not None else "")
        attributes["created"] = at
        attributes["msecs"] = int((at - int(at)) * 1000) + 0.0
        attributes["relativeCreated"] = template["relativeCreated"] + (at - template["created"]) * 1000
        attributes.update(fields)
        return record


def trace_ids(message: MessageProxy) -> dict[str, str] | None:
    """The job's trace and span ids, where tracing (``supervisor.tracing``) ran it in a span."""
    return getattr(message, "trace_ids", None)
