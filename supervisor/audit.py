"""The ``audit_log`` table: every action taken over HTTP, who took it, and what it changed.

The HTTP child writes a row per action (``http/auth.py``'s guard, refusals included); the
workers' upkeep prunes rows older than ``retention.audit``; the dashboard's Audit page and
``GET /api/v1/audit`` read them, newest first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from . import db

INSERT = """
INSERT INTO audit_log (token_name, role, action, target, filter, detail, affected, job_ids, status, outcome, client)
VALUES (%(token_name)s, %(role)s, %(action)s, %(target)s, %(filter)s, %(detail)s, %(affected)s,
        %(job_ids)s::uuid[], %(status)s, %(outcome)s, %(client)s)
"""

# Newest first; every filter optional; the next page starts below the last id seen.
LIST = """
SELECT id, at, token_name, role, action, target, filter, detail, affected, job_ids, status, outcome, client
  FROM audit_log
 WHERE (%(token_name)s::text IS NULL OR token_name = %(token_name)s)
   AND (%(action)s::text IS NULL OR action = %(action)s)
   AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
 ORDER BY id DESC
 LIMIT %(limit)s
"""

# Retention: a bounded batch of the oldest rows past their age per statement.
PRUNE = """
DELETE FROM audit_log WHERE id IN (
    SELECT id FROM audit_log WHERE at < now() - %(older_than_s)s * interval '1 second' ORDER BY at LIMIT %(limit)s)
"""


@dataclass
class Entry:
    """One action, filled in as it goes: the guard knows who and what, the handler what changed."""

    action: str
    token_name: str | None = None
    role: str | None = None
    target: str | None = None
    filter: dict[str, Any] | None = None
    detail: dict[str, Any] | None = None
    affected: int | None = None
    job_ids: list[str] | None = field(default=None)
    status: int = 0
    outcome: str | None = None
    client: str | None = None


def record(conn: psycopg.Connection, entry: Entry) -> None:
    row = asdict(entry)
    for key in ("filter", "detail"):
        row[key] = Jsonb(row[key]) if row[key] is not None else None
    row["job_ids"] = db.array_text(row["job_ids"]) if row["job_ids"] is not None else None
    conn.execute(INSERT, row)


def recent(conn: psycopg.Connection, *, token_name: str | None = None, action: str | None = None,
           before_id: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
    return db.dicts(conn, LIST, {"token_name": token_name, "action": action, "before_id": before_id,
                                 "limit": limit})
