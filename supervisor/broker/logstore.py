"""The job log's side of the broker (migration 039, sql/joblog.py): which messages a
producer appends to the log, log rows claimed as messages, the batches a process holds,
and the parameters of their outcomes and releases.

A broker with ``storage="log"`` appends to the log every message that needs nothing the
log does not keep: no dedupe, concurrency or limit key, an actor it knows (one with a delay,
and a retry, waits in ``job_timers`` until due: sql/timers.py). Everything else lives in
``job_queue`` as before; a worker of such a broker claims both.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import db, defaults
from . import bulk
from .message import PgMessageProxy, Unreadable, from_claimed_row
from .sql import joblog


@dataclass(frozen=True)
class LogRow:
    """Where a claimed job's attempt lives in the log: its row (seq, day) and the leased
    batch it was claimed in; its queue, actor and creation, which its done row keeps. day
    and created_at as the server wrote them (LOG_CLAIM): they are only sent back."""

    seq: int
    day: str
    batch: int
    queue: str
    actor: str
    created_at: str


def loggable(row: tuple[Any, ...], actors: Container[str]) -> bool:
    """Whether a producer's row (bulk.rows' tuple, due now) can be appended to the log."""
    return (row[bulk.KEY] is None and row[bulk.CONCURRENCY_KEY] is None and row[bulk.FLOW_KEY] is None
            and row[bulk.ACTOR] in actors)


def log_row(row: tuple[Any, ...], max_lease_losses: int | None) -> tuple[Any, ...]:
    """A loggable row's values in sql.LOG_COLUMNS order. ``max_lease_losses``: the message's
    or its actor's, stated on the row (the default's when neither sets one), since a release
    by any process spends it; job_queue's claim fills the same default in, so both stores
    show the budget they apply."""
    return (*row[:bulk.KEY], defaults.MAX_LEASE_LOSSES if max_lease_losses is None else max_lease_losses,
            row[bulk.STAMP])


def insert_params(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """sql.LOG_INSERT's arrays for ``log_row`` rows."""
    return dict(zip(_LOG_NAMES, map(list, zip(*rows, strict=True)), strict=True))


_LOG_NAMES = [name.strip() for name in joblog.LOG_COLUMNS.split(",")]


def append(conn: psycopg.Connection, rows: Sequence[tuple[Any, ...]], *, again: bool) -> None:
    """``log_row`` rows appended with the check and COPY (sql.LOG_COPY), in the caller's
    transaction: those whose id a live job has are left out (``again``: any row of the log
    with the id too, as LOG_INSERT_AGAIN)."""
    check = joblog.LOG_SENT_IDS if again else joblog.LOG_LIVE_IDS
    live = {r[0] for r in conn.execute(check, {"ids": db.array_text([r[0] for r in rows])})}
    with conn.cursor() as cur, cur.copy(joblog.LOG_COPY) as copy:
        for row in rows:
            if row[0] not in live:
                copy.write_row(row)


def storage(value: str | None) -> str:
    """A broker's storage: ``value``, else SUPERVISOR_STORAGE, else the default; one line
    naming the choices when it is none of them."""
    chosen = value or os.environ.get(defaults.STORAGE_ENV) or defaults.STORAGE
    if chosen not in defaults.STORAGES:
        raise ValueError(f"storage must be one of {', '.join(defaults.STORAGES)}, not {chosen!r}"
                         f"{'' if value else f' (from {defaults.STORAGE_ENV})'}")
    return chosen


# LOG_CLAIM's columns (job_log_claim, migration 039)
(_BATCH, _SEQ, _DAY, _ID, _QUEUE, _ACTOR, _BODY, _ATTEMPT, _MAX_ATTEMPTS, _LOSSES, _MAX_LOSSES, _STAMP, _PAYLOAD,
 _PRIORITY, _CREATED) = range(15)


def decode(rows: Iterable[tuple[Any, ...]], actors: Container[str], default_max_attempts: int
           ) -> tuple[list[PgMessageProxy], list[tuple[str, int, str, LogRow]]]:
    """The messages of claimed log rows (each with its ``log_row``), and (id, attempt,
    why, row) of those that cannot be one."""
    out, bad = [], []
    for r in rows:
        where = LogRow(r[_SEQ], r[_DAY], r[_BATCH], r[_QUEUE], r[_ACTOR], r[_CREATED])
        # sql.CLAIM's column order (message.from_claimed_row): a log row has no concurrency key
        shaped = (str(r[_ID]), r[_QUEUE], r[_ACTOR], r[_BODY], r[_ATTEMPT],
                  r[_MAX_ATTEMPTS] or default_max_attempts, None, r[_LOSSES], r[_STAMP], r[_PAYLOAD])
        try:
            message = from_claimed_row(shaped, actors)
        except (Unreadable, ValueError, TypeError) as exc:
            bad.append((str(r[_ID]), int(r[_ATTEMPT]), f"cannot become a message: {exc}", where))
            continue
        message.log_row = where
        out.append(message)
    return out, bad


def release_params(who: str, *, why: str, margin_s: float | None = None, owners: Sequence[str] = (),
                   stale_beats: float | None = None, node: str | None = None,
                   limit: int = 1000) -> dict[str, Any]:
    """sql.LOG_RELEASE's parameters (each arm off unless given)."""
    return {"who": who, "why": why, "margin_s": margin_s, "owners": list(owners), "stale_beats": stale_beats,
            "node": node, "limit": limit, "max_losses": defaults.MAX_LEASE_LOSSES}


class Batches:
    """The log batches a process holds: which of its claimed jobs' outcomes are not yet
    written, per batch. A batch's lease row may go only once every outcome of it is
    committed (else a crash in between would leave a job with no lease and no outcome,
    which nothing would release): ``written`` says which batches that makes whole, and
    they go with the next outcome statement or beat (``take_ended``)."""

    def __init__(self) -> None:
        self._rows: dict[str, LogRow] = {}  # job id -> its claimed row
        self._open: dict[int, set[str]] = {}  # batch -> job ids with no outcome written
        self._ended: set[int] = set()
        self._results: dict[str, Any] = {}  # job id -> its stored result (jsonb), until its outcome is written
        # batches with a job this process gave up unfinished (fenced, no outcome): their lease row
        # must outlive its renewals, expire, and be released (LOG_RELEASE), never be deleted
        self._abandoned: set[int] = set()
        self._lock = threading.Lock()

    def hold(self, rows: Iterable[tuple[str, LogRow]]) -> None:
        """Claimed rows: (job id, its row)."""
        with self._lock:
            for job_id, row in rows:
                self._rows[job_id] = row
                self._open.setdefault(row.batch, set()).add(job_id)

    def row(self, job_id: str) -> LogRow | None:
        return self._rows.get(job_id)

    def __bool__(self) -> bool:
        return bool(self._rows) or bool(self._ended)

    def split(self, job_ids: Sequence[str]) -> tuple[list[int], list[LogRow]]:
        """Indexes of ``job_ids`` held in the log, and their rows."""
        rows = self._rows
        idx = [i for i, j in enumerate(job_ids) if j in rows]
        return idx, [rows[job_ids[i]] for i in idx]

    def keep_result(self, job_id: str, result: Any) -> None:
        """A held job's stored result: its outcome's write carries it (``results``)."""
        with self._lock:
            if job_id in self._rows:
                self._results[job_id] = result

    def results(self, job_ids: Sequence[str]) -> list[Any] | None:
        """sql.LOG_FINISH's results for these jobs (None: none has one, the common case)."""
        if not self._results:
            return None
        with self._lock:
            return [self._results.get(j) for j in job_ids]

    def written(self, job_ids: Iterable[str]) -> None:
        """Their outcomes are committed (or were ended by others: a release, a cancel)."""
        with self._lock:
            for job_id in job_ids:
                self._results.pop(job_id, None)
                row = self._rows.pop(job_id, None)
                if row is None:
                    continue
                self._close(row.batch, job_id)

    def abandon(self, job_ids: Iterable[str]) -> None:
        """Jobs this process stopped without an outcome (fenced: their lease was late, or they
        were cancelled or released by others). Their batch is renewed while it holds other
        jobs, then left to expire: the reaper releases what has no outcome (a deleted lease
        row would leave a job nothing can find)."""
        with self._lock:
            for job_id in job_ids:
                self._results.pop(job_id, None)
                row = self._rows.pop(job_id, None)
                if row is not None:
                    self._abandoned.add(row.batch)
                    self._close(row.batch, job_id)

    def _close(self, batch: int, job_id: str) -> None:
        """A job of the batch is no longer open (under the lock); the last one ends the
        batch (its lease row goes with the next write), unless one was abandoned."""
        left = self._open.get(batch)
        if left is None:
            return
        left.discard(job_id)
        if not left:
            del self._open[batch]
            if batch in self._abandoned:
                self._abandoned.discard(batch)
            else:
                self._ended.add(batch)

    def take_ended(self) -> list[int]:
        with self._lock:
            out = sorted(self._ended)
            self._ended.clear()
            return out

    def give_back(self, ended: Iterable[int]) -> None:
        """Batches taken whose statement failed: ended again by the next one."""
        with self._lock:
            self._ended.update(ended)

    def held(self) -> list[int]:
        with self._lock:
            return list(self._open)

    def jobs_of(self, batches: Iterable[int]) -> list[str]:
        with self._lock:
            return [j for b in batches for j in self._open.get(b, ())]
