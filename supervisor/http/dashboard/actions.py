"""The dashboard's actions: retry, cancel (one, some, or all matching a filter), pause
and resume a queue, run a schedule now, scale a role through the local master, set or
clear a limit key's override.

Each is a POST the action guard has already let through (token, read-only); each
answers JSON ``{"ok": ..., "message": ...}`` that the page shows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ... import admin, control, limits
from ...broker import sql
from ...identity import operator
from ...worker import scheduler_sql
from ..state import AppState
from . import gather

CHANGES: dict[str, Callable[[psycopg.Connection, str], bool]] = {"retry": admin.retry_job,
                                                                  "cancel": admin.cancel_job}


def change_jobs(state: AppState, action: str, ids: list[str], where: admin.JobFilter | None) -> dict[str, Any]:
    """Apply ``action`` to ``ids``, or to every job matching ``where`` (bounded)."""
    change = CHANGES[action]
    with state.connection() as conn:
        targets = gather.matching_ids(conn, where) if where is not None else [str(uuid.UUID(i)) for i in ids]
        done = [i for i in targets if change(conn, i)]
    verb = "retried" if action == "retry" else "cancelled"
    skipped = len(targets) - len(done)
    tail = f"; {skipped} not in a state that allows it" if skipped else ""
    return {"ok": bool(done) or not targets, "message": f"{len(done)} job(s) {verb}{tail}", "changed": done}


def set_paused(state: AppState, queue: str, paused: bool) -> dict[str, Any]:
    with state.connection() as conn:
        if paused:
            changed = admin.pause_queue(conn, queue, reason="paused from the dashboard")
        else:
            changed = admin.resume_queue(conn, queue)
    word = "paused" if paused else "resumed"
    return {"ok": True, "message": f"queue {queue} {word}" if changed else f"queue {queue} was already {word}"}


def run_schedule_now(state: AppState, name: str) -> dict[str, Any]:
    """Enqueue the schedule's job now, recorded as a run like a cron fire (skipped while
    its previous job is still live, as a fire would be)."""
    schedule = next((s for s in (state.config.schedules if state.config else ()) if s.name == name), None)
    if schedule is None:
        return {"ok": False, "message": f"no schedule named {name!r} in the config"}
    now = datetime.now(UTC)
    job_id = uuid.uuid4()
    with state.connection() as conn:
        row = conn.execute(scheduler_sql.START_RUN, {"name": name, "fire_at": now, "holder": operator()}).fetchone()
        if row is None:
            return {"ok": False, "message": "a run for this instant exists already; try again"}
        inserted = conn.execute(sql.INSERT, {
            "id": job_id, "queue": schedule.queue, "actor": schedule.actor, "args": Jsonb(list(schedule.args)),
            "kwargs": Jsonb(dict(schedule.kwargs)),
            "options": Jsonb({"schedule": name, "scheduled_for": now.isoformat(), "run_now": True}),
            # No budget here: the worker gives the row its actor's budgets at the first claim.
            "priority": 0, "delay_ms": 0, "max_attempts": None,
            "dedupe_key": f"schedule:{name}", "concurrency_key": None,
            "message_timestamp": int(now.timestamp() * 1000), "payload": None,
            "flow_key": None, "flow": None}).fetchone()  # no limits: a schedule's job as the config names it
        if inserted is None:
            conn.execute(scheduler_sql.COMPLETE_RUN, {"id": row[0], "status": "skipped",
                                                      "error": "the previous run's job is still pending or running"})
            return {"ok": False, "message": f"schedule {name}: the previous run's job is still live; skipped"}
        conn.execute(scheduler_sql.SET_RUN_JOB, {"id": row[0], "job_id": job_id})
    return {"ok": True, "message": f"schedule {name}: job {job_id} enqueued", "job_id": str(job_id)}


def scale(state: AppState, role: str, processes: int) -> dict[str, Any]:
    """`supervisor scale ROLE N` through the local master's control socket (it applies
    the same rules and answers once the new count is reached or refused)."""
    path = state.control_socket
    if path is None or not path.exists():
        return {"ok": False, "message": "no local master: scale from the host that runs it"}
    try:
        reply = control.request(path, {"cmd": "scale", "role": role, "processes": processes}, timeout=60)
    except control.ControlError as exc:
        return {"ok": False, "message": str(exc)}
    if not reply.get("ok"):
        return {"ok": False, "message": str(reply.get("error"))}
    return {"ok": True, "message": "; ".join(reply.get("changes") or [f"{role} scaled to {processes}"])}


def set_limit(state: AppState, key: str, override: dict[str, Any], by: str) -> dict[str, Any]:
    with state.connection() as conn:
        return limits.set_override(conn, key, override, by)


def clear_limit(state: AppState, key: str, by: str) -> dict[str, Any] | None:
    with state.connection() as conn:
        return limits.clear_override(conn, key, by)

