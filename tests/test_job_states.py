"""A job's state machine (supervisor/jobstates.py): the diagram in docs/job-states.md is
its table, the database's constraints allow exactly its states, and the moves real jobs
make (job_events, written by the code that moves them) are all in it."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from supervisor import admin
from supervisor.jobstates import ENDED, SENT, TRANSITIONS, JobState, Outcome, allowed

ROOT = Path(__file__).resolve().parent.parent


def test_the_diagram_in_docs_is_the_transition_table() -> None:
    text = (ROOT / "docs" / "job-states.md").read_text()
    diagram = text.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn = re.findall(r"^\s*(\[\*\]|\w+) --> (\[\*\]|\w+)(?: : (.+))?$", diagram, re.M)
    moves = {(a, b): why for a, b, why in drawn}
    assert {b for a, b in moves if a == "[*]"} == {s.value for s in SENT}
    assert {a for a, b in moves if b == "[*]"} == {s.value for s, out in TRANSITIONS.items() if not out}
    table = {(a.value, b.value): why for a, out in TRANSITIONS.items() for b, why in out.items()}
    assert {k: v for k, v in moves.items() if "[*]" not in k} == table


def test_the_tables_constraints_allow_exactly_these_states(conn) -> None:
    def allowed_by(table: str) -> set[str]:
        checks = [r[0] for r in conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'"
            " AND pg_get_constraintdef(oid) LIKE '%%status = ANY%%'", (table,))]
        return {s for c in checks for s in re.findall(r"'(\w+)'::text", c)}

    live = {JobState.PENDING, JobState.WAITING, JobState.RUNNING, JobState.RETRYABLE}
    assert allowed_by("job_queue") == {s.value for s in live}
    assert {s.value for s in JobState} == {s.value for s in live | ENDED}
    assert allowed_by("job_done") == {o.value for o in Outcome}
    assert tuple(s.value for s in JobState) == admin.JOB_STATUSES


@pytest.mark.parametrize(("before", "after", "ok"), [
    (None, "pending", True), (None, "running", False), ("running", "succeeded", True),
    ("succeeded", "pending", False), ("failed", "pending", True), ("pending", "succeeded", False),
    ("running", "nonsense", False), ("nonsense", "pending", False),
])
def test_allowed(before, after, ok) -> None:
    assert allowed(before, after) is ok


def test_every_state_but_the_ended_ones_can_end() -> None:
    """From every state some path of moves reaches an ended state (nothing is stuck by design)."""
    for start in JobState:
        seen, todo = {start}, [start]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert seen & ENDED, start


@pytest.mark.parametrize("key", [None, "account-1"], ids=["plain", "with a limit key"])
@pytest.mark.parametrize("was", ["failed", "cancelled"])
def test_an_operators_retry_writes_the_move_it_makes(conn, was, key) -> None:
    """A finished job of job_history retried by an operator (admin.retry_job): its event
    says where it came from and where it went (pending, or waiting with a limit key)."""
    job = str(uuid.uuid4())
    conn.execute("INSERT INTO jobs (id, queue, actor, status, attempts, max_attempts, finished_at, flow_key, flow)"
                 " VALUES (%s, 'q', 'a', %s, 1, 1, now(), %s, %s)",
                 (job, was, key, None if key is None else Jsonb({"c": 1})))
    assert admin.retry_job(conn, job)
    went = "pending" if key is None else "waiting"
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s", (job,)).fetchall() == [
        (was, went)]
    assert allowed(was, went)
