"""Operator reads and fixes of workflows (migration 049): list, show, cancel and retry of a
whole workflow or of one step and its descendants. Shared by the CLI and the HTTP API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg

from . import db
from .admin import cancel_job
from .broker.sql import workflows as sql
from .identity import operator

STATES = ("running", "succeeded", "failed", "cancelled")


class WorkflowError(ValueError):
    """A workflow or step that does not exist, or a change it cannot take (one line)."""


def list_workflows(conn: psycopg.Connection, *, state: str | None = None, limit: int = 50,
                   before: tuple[datetime, str] | None = None) -> list[dict[str, Any]]:
    """A page of workflows, newest first; ``before``: the (created_at, id) of the last row of
    the page before."""
    if state is not None and state not in STATES:
        raise WorkflowError(f"unknown state {state!r} (one of {', '.join(STATES)})")
    at, wid = before if before is not None else (None, None)
    return db.dicts(conn, sql.LIST, {"state": state, "limit": limit, "before_at": at, "before_id": wid})


def show(conn: psycopg.Connection, workflow: str) -> dict[str, Any] | None:
    """A workflow with its steps (state, parents, children, job id, timings, result)."""
    check_id(workflow)
    found = db.dicts(conn, sql.GET, {"id": workflow})
    if not found:
        return None
    return {**found[0], "steps": db.dicts(conn, sql.STEPS, {"id": workflow})}


def _one(conn: psycopg.Connection, query: str, params: dict[str, Any]) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def check_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise WorkflowError(f"not a workflow or step id: {text!r}") from None


def _locked(c: psycopg.Connection, workflow: str, step: str | None) -> None:
    check_id(workflow)
    if c.execute(sql.LOCK, {"id": workflow}).fetchone() is None:
        raise WorkflowError(f"no workflow {workflow}")
    if step is not None:
        check_id(step)
        row = c.execute(sql.STEP_OF, {"step": step}).fetchone()
        if row is None or str(row[0]) != workflow:
            raise WorkflowError(f"no step {step} in workflow {workflow}")


def cancel(conn: psycopg.Connection, workflow: str, *, step: str | None = None) -> dict[str, int]:
    """Cancel every step not ended, or ``step`` and its descendants: the waiting ones at
    once, the running ones marked cancelled and their jobs cancelled (interrupted) after."""
    who = operator()
    why = "cancelled by an operator" + (f" (step {step} and its descendants)" if step else "")
    with conn.transaction():
        _locked(conn, workflow, step)
        targets = _one(conn, sql.CANCEL_TARGETS, {"id": workflow, "step": step})
        running = _one(conn, sql.CANCEL_STEPS, {"ids": targets, "why": why, "who": who}) or []
        conn.execute(sql.MARK_CANCELLED, {"ids": running, "why": why})
        conn.execute(sql.SET_REASON, {"id": workflow, "why": why})
    # After the commit, each in its own transaction: a job's cancel waits for its ack in
    # flight, whose trigger would wait for this workflow's row (migration 049's lock order).
    for job in running:
        cancel_job(conn, str(job))
    return {"cancelled": len(targets), "interrupted": len(running)}


def retry(conn: psycopg.Connection, workflow: str, *, step: str | None = None) -> dict[str, int]:
    """Run again the failed and cancelled steps and their descendants (or ``step`` and its
    descendants); succeeded steps outside keep their results."""
    with conn.transaction():
        _locked(conn, workflow, step)
        targets = _one(conn, sql.RETRY_TARGETS, {"id": workflow, "step": step})
        if not targets:
            raise WorkflowError(f"workflow {workflow} has no ended step to retry"
                                + (f" at step {step}" if step else ""))
        conn.execute(sql.RESET, {"ids": targets})
        conn.execute(sql.RECOUNT, {"ids": targets})
        conn.execute(sql.CLEAR_REASON, {"id": workflow})
        released = _one(conn, sql.RELEASE, {"ids": targets})
    return {"retried": len(targets), "released": released}


def counts_by_state(conn: psycopg.Connection) -> dict[str, int]:
    """Workflows per state (every state, 0 when none): the metrics' gauge."""
    found: dict[str, int] = dict(conn.execute(sql.BY_STATE).fetchall())
    return {s: int(found.get(s, 0)) for s in STATES}


def workflow_of_job(conn: psycopg.Connection, job_id: str) -> str | None:
    row = conn.execute(sql.OF_JOB, {"id": job_id}).fetchone()
    return None if row is None else str(row[0])
