"""The job log's side of the broker (migration 039, sql/joblog.py): which messages a
producer appends to the log, log rows claimed as messages, the batches a process holds,
and the parameters of their outcomes and releases.

A broker appends to the log every message that needs nothing the log does not keep, its
actor known or not (055: ``decode``): a plain one (one with a delay, and a retry, waits in
``job_timers`` until due: sql/timers.py), one with a dedupe key (taken in ``job_keys`` as it
is written: sql/jobkeys.py, 052), one whose limit key carries a concurrency limit (a slot:
sql/slots.py, 053), a rate limit or a daily quota (its start reserved by its claim, 054), a
fairness weight (its key's turn: sql/fair.py, 056). Everything else lives in ``job_queue``
as before; a worker claims both.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import struct
import threading
import uuid
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import postgres
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format

from .. import db, defaults
from . import bulk
from .message import PgMessageProxy, Unreadable, from_claimed_row
from .sql import jobkeys, joblog


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
    # The attempt claimed (0: not known). A job's id names its row here, and the process may
    # hold the job's next row (a retry appended again, claimed again) before an earlier
    # attempt's outcome is written: the outcome finds its row only by id and attempt, so it
    # never lands on the next attempt's row.
    attempt: int = 0


def loggable(row: tuple[Any, ...], *, keyed: bool = False) -> bool:
    """Whether a producer's row (bulk.rows' tuple, due now) can be appended to the log: a
    plain one, one with a dedupe key (taken in job_keys as the row is written: 052), and
    (``keyed``) one whose limit key carries a concurrency limit (053), a rate limit or a
    daily quota (054), a fairness weight (056), with or without a dedupe key; its actor
    known or not (055: an unknown one's row has no max_attempts unless its options give one,
    which ``decode`` fills in and reads as "keyed by no one": late_keys.py)."""
    if row[bulk.FLOW_KEY] is None:
        return row[bulk.CONCURRENCY_KEY] is None
    return keyed and log_limits(row[bulk.FLOW_KEY + 1])


# The limits (flow.Limits.json's letters) the log's claim applies: concurrency (053's slots),
# rate and burst, daily quota (054's reservations), a weight (056: the key's turn). A key with
# none of them (a fairness key of weight 1) takes turns too.
_LOG_LIMITS = frozenset("crbqw")


@functools.lru_cache(maxsize=256)
def log_limits(limits: str | None) -> bool:
    """Whether a row's limits (flow.Limits.json) are only ones the log's claim applies."""
    return limits is not None and set(json.loads(limits)) <= _LOG_LIMITS


# A plain log row's width (sql.LOG_COLUMNS), so a plain row's tuple, statements and COPY
# text stay as they were. After them a deduped row has its dedupe key (one more), a
# concurrency-keyed one its limit key and limits (two more: slots.LOG_KEYED_COLUMNS), and
# one with both all three (jobkeys.KEYED_COLUMNS), which jobkeys' statements write.
WIDTH = len(joblog.LOG_COLUMNS.split(","))
_DEDUPED = (WIDTH + 1, WIDTH + 3)


def log_row(row: tuple[Any, ...], max_lease_losses: int | None) -> tuple[Any, ...]:
    """A loggable row's values in sql.LOG_COLUMNS order, then its dedupe key if it has one,
    or its limit key and limits if it has them. ``max_lease_losses``: the message's or its
    actor's, stated on the row (the default's when neither sets one), since a release by any
    process spends it; job_queue's claim fills the same default in, so both stores show the
    budget they apply."""
    out = (*row[:bulk.KEY], defaults.MAX_LEASE_LOSSES if max_lease_losses is None else max_lease_losses,
           row[bulk.STAMP])
    if row[bulk.FLOW_KEY] is not None:
        flow = (row[bulk.FLOW_KEY], row[bulk.FLOW_KEY + 1])
        return (*out, *flow) if row[bulk.KEY] is None else (*out, row[bulk.KEY], *flow)
    return out if row[bulk.KEY] is None else (*out, row[bulk.KEY])


def key_of(row: tuple[Any, ...]) -> Any:
    """A log row's dedupe key (None: none)."""
    return row[WIDTH] if len(row) in _DEDUPED else None


def flow_keyed(row: tuple[Any, ...]) -> bool:
    """Whether a log row carries a limit key and its limits and no dedupe key (a
    concurrency-keyed job: slots.LOG_INSERT_KEYED writes it)."""
    return len(row) == WIDTH + 2


def keyed_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A deduped row with every column of jobkeys.KEYED_COLUMNS (its limit key and limits
    NULL if it has none), as jobkeys' statements and the keyed COPY take it."""
    return row if len(row) == WIDTH + 3 else (*row, *(None,) * (WIDTH + 3 - len(row)))


def keyed_params(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """slots.LOG_INSERT_KEYED's arrays for concurrency-keyed ``log_row`` rows."""
    return dict(zip([*_LOG_NAMES, "flow_key", "flow"], map(list, zip(*rows, strict=True)), strict=True))


def insert_params(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """sql.LOG_INSERT's arrays for ``log_row`` rows (jobkeys.LOG_INSERT_KEYED's for keyed ones)."""
    return dict(zip(_KEYED_NAMES, map(list, zip(*rows, strict=True)), strict=False))


_KEYED_NAMES = [name.strip() for name in jobkeys.KEYED_COLUMNS.split(",")]
_LOG_NAMES = _KEYED_NAMES[:WIDTH]  # sql.LOG_COLUMNS'


def append(conn: psycopg.Connection, rows: Sequence[tuple[Any, ...]] | Callable[[], Sequence[tuple[Any, ...]]], *,
           again: bool, ids: list[str] | None = None) -> None:
    """``log_row`` rows appended with the check and COPY (sql.LOG_COPY), in the caller's
    transaction if ``conn`` is in one (else the COPY is a transaction of its own): those
    whose id a live job has are left out (``again``: any row of the log with the id too, as
    LOG_INSERT_AGAIN), and an id repeated in ``rows`` is written once (its first row).

    The check is sent in a pipeline and the COPY's text built while the server runs it (a
    round trip and the check's server time the client no longer waits through: the check
    probes an index per id and per day, 1-2 ms for 1,000 ids; the text is written as one
    block, not row by row through psycopg's formatter). ``rows`` may be a function that
    builds them, given the rows' ``ids`` (in PostgreSQL's text form, ``_canonical``): then
    they are built in that time too. The rows go in in the order sent: the claim takes a
    transaction's rows in seq order, so a batch runs first in, first out, as the messages
    of Dramatiq's other brokers do. (In id order, each row's entry in job_log's id index
    lands beside the previous one's: 6 % of the COPY's server time, bench/README.md,
    sixteenth session; but a batch of random ids then runs in a random order.)"""
    early = callable(rows) and ids is not None and _canonical(ids)
    ordered: list[tuple[Any, ...]] = []
    if not early:
        ordered = unique_rows(rows() if callable(rows) else rows)
        ids = [r[0] for r in ordered]
    keyed = any(len(r) > WIDTH for r in ordered)
    check = joblog.LOG_SENT_IDS if again else joblog.LOG_LIVE_IDS
    # (a libpq older than 14 has no pipeline: the check then waits for its answer, as before)
    with conn.pipeline() if psycopg.Pipeline.is_supported() else contextlib.nullcontext():
        found = conn.execute(check, {"ids": id_array(conn, ids or [])})
        if early:
            ordered = unique_rows(rows())  # type: ignore[operator]
        text = copy_text(ordered, keyed=keyed)
        live = {r[0] for r in found}
    if live:
        text = copy_text([r for r in ordered if r[0] not in live], keyed=keyed)
    with conn.cursor() as cur, cur.copy(jobkeys.LOG_COPY_KEYED if keyed else joblog.LOG_COPY) as copy:
        copy.write(text)


def unique_rows(rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``log_row`` rows with each id once (its first row), every id in PostgreSQL's text
    form: the form the live-id checks answer in, so a live id is known by its text, and
    one id written two ways is one id."""
    if not _canonical([r[0] for r in rows]):
        rows = [(_uuid_text(r[0]), *r[1:]) for r in rows]
    first: dict[Any, tuple[Any, ...]] = {}
    for row in rows:
        first.setdefault(row[0], row)
    return list(first.values())


class UuidArray(bytes):
    """A uuid[] parameter in PostgreSQL's binary array form (``id_array``)."""


class _UuidArrayDumper(Dumper):
    format = Format.BINARY
    oid = postgres.types["uuid"].array_oid

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


# dimensions, whether any element is NULL, the element type, the length, the lower bound
_ARRAY_HEAD = struct.Struct("!iiIii")
_UUID_OID = postgres.types["uuid"].oid
postgres.adapters.register_dumper(UuidArray, _UuidArrayDumper)


def _shaped(joined: str, n: int) -> bool:
    """Whether ``joined`` is n ids of 36 characters, each with its hyphens where a uuid's
    text has them (8-4-4-4-12)."""
    return len(joined) == 36 * n and all(joined[k::36].count("-") == n for k in (8, 13, 18, 23))


def _canonical(ids: list[str]) -> bool:
    """Whether every id is a uuid as PostgreSQL writes one (lower case, 8-4-4-4-12): the
    form the check returns, so a live id is known by its text. Dramatiq's ids are; for
    others the rows are given that form first (``_uuid_text``)."""
    joined = "".join(ids)  # (a character no uuid has fails the check's cast, and the COPY's, as before)
    return _shaped(joined, len(ids)) and joined.islower()


def _uuid_text(job_id: str) -> str:
    """A message id as PostgreSQL writes the uuid (as it was when it is none: the COPY
    then fails on it, as it did)."""
    try:
        return str(uuid.UUID(job_id))
    except (ValueError, TypeError, AttributeError):
        return job_id


def id_array(conn: psycopg.Connection, ids: list[str]) -> UuidArray | str:
    """A batch's ids as one uuid[] parameter, in binary when every id is a uuid in its
    canonical text form (what Dramatiq makes): the server's array_in took 1 ms for 1,000
    ids written as text, array_recv a tenth of it, and the hex decoded here in one call
    and 20 strided copies costs ~0.1 ms. Any other id: ``db.array_text`` (the server
    parses each as it can)."""
    n = len(ids)
    joined = "".join(ids)
    if n and _shaped(joined, n):
        try:  # each id's 32 other characters hex (whitespace, which fromhex skips, shortens it)
            raw = bytes.fromhex(joined.replace("-", ""))
        except ValueError:
            raw = b""
        if len(raw) == 16 * n:
            body = bytearray(20 * n)  # each element: its length (16), then its 16 bytes
            body[3::20] = b"\x10" * n
            for k in range(16):
                body[4 + k::20] = raw[k::16]
            if conn.adapters.get_dumper(UuidArray, PyFormat.BINARY) is not _UuidArrayDumper:
                conn.adapters.register_dumper(UuidArray, _UuidArrayDumper)  # a connection of its own map
            return UuidArray(_ARRAY_HEAD.pack(1, 0, _UUID_OID, n, 1) + body)
    return db.array_text(ids)


# COPY's text format: these characters of a value are written as escapes
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


_NULL = "\\N"


def _copy_field(value: Any) -> str:
    if value is None:
        return _NULL
    if isinstance(value, (bytes, bytearray, memoryview)):  # bytea's hex form, its backslash escaped
        return "\\\\x" + bytes(value).hex()
    return str(value).translate(_COPY_ESCAPES)


def copy_text(rows: Iterable[tuple[Any, ...]], *, keyed: bool = False) -> bytes:
    """``log_row`` rows as sql.LOG_COPY's input (``keyed``: jobkeys.LOG_COPY_KEYED's, each row
    with its keys or NULLs: keyed_row). A row whose text needs no escape (ids, queue and actor names,
    compact JSON: nearly every one) is one f-string; any other goes field by field."""
    if keyed:
        return "".join("\t".join(map(_copy_field, keyed_row(row))) + "\n" for row in rows).encode()
    lines = []
    for row in rows:
        job_id, queue, actor, args, kwargs, options, payload, priority, max_attempts, losses, stamp = row
        text = f"{job_id}\t{queue}\t{actor}\t{args}\t{kwargs}\t{options}"
        if text.count("\t") == 5 and "\\" not in text and "\n" not in text and "\r" not in text:
            lines.append(f"{text}\t{_NULL if payload is None else _copy_field(payload)}\t{priority}\t"
                         f"{_NULL if max_attempts is None else max_attempts}\t{losses}\t"
                         f"{_NULL if stamp is None else stamp}\n")
        else:
            lines.append("\t".join(map(_copy_field, row)) + "\n")
    return "".join(lines).encode()


def ignored_storage(value: str | None) -> None:
    """Say once that a storage chosen the old way (a broker's ``storage=``, or
    SUPERVISOR_STORAGE) changes nothing now: every job the log takes goes there (one
    store), and every worker claims it. A program written for storage "table" keeps
    working: its jobs run from the log."""
    chosen = value or os.environ.get(defaults.STORAGE_ENV)
    if chosen and chosen != "log" and not _said_storage:
        _said_storage.append(chosen)
        logging.getLogger(__name__).warning(
            "storage %r is no longer a choice (every job the log takes lives in the log): the setting is ignored; "
            "remove %s", chosen, "storage=" if value else defaults.STORAGE_ENV)


_said_storage: list[str] = []


# LOG_CLAIM's columns (job_log_claim, migration 039)
(_BATCH, _SEQ, _DAY, _ID, _QUEUE, _ACTOR, _BODY, _ATTEMPT, _MAX_ATTEMPTS, _LOSSES, _MAX_LOSSES, _STAMP, _PAYLOAD,
 _PRIORITY, _CREATED) = range(15)


def decode(rows: Iterable[tuple[Any, ...]], actors: Container[str], budget: Callable[[PgMessageProxy], int]
           ) -> tuple[list[PgMessageProxy], list[tuple[str, int, str, LogRow]], set[str]]:
    """The messages of claimed log rows (each with its ``log_row``), (id, attempt, why, row)
    of those that cannot be one, and the ids of those written with no max_attempts (by a
    writer that did not know their actor: a send by name, an SQL insert), whose budget is
    then ``budget``'s (middleware.row_budget)."""
    out, bad, unbudgeted = [], [], set()
    for r in rows:
        where = LogRow(r[_SEQ], r[_DAY], r[_BATCH], r[_QUEUE], r[_ACTOR], r[_CREATED], r[_ATTEMPT])
        # sql.CLAIM's column order (message.from_claimed_row): a log row has no concurrency key
        shaped = (str(r[_ID]), r[_QUEUE], r[_ACTOR], r[_BODY], r[_ATTEMPT],
                  r[_MAX_ATTEMPTS] or 1, None, r[_LOSSES], r[_STAMP], r[_PAYLOAD])
        try:
            message = from_claimed_row(shaped, actors)
        except (Unreadable, ValueError, TypeError) as exc:
            bad.append((str(r[_ID]), int(r[_ATTEMPT]), f"cannot become a message: {exc}", where))
            continue
        if not r[_MAX_ATTEMPTS]:
            if r[_MAX_ATTEMPTS] is None:
                unbudgeted.add(message.message_id)
            message.max_attempts = budget(message)
        message.log_row = where
        out.append(message)
    return out, bad, unbudgeted


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

    def row(self, job_id: str, attempt: int | None = None) -> LogRow | None:
        """The row held for the job; given ``attempt``, only if it is that attempt's (an
        earlier attempt's late outcome has no row here: fenced, as by the done row)."""
        row = self._rows.get(job_id)
        if row is not None and attempt is not None and row.attempt and row.attempt != attempt:
            return None
        return row

    def __bool__(self) -> bool:
        return bool(self._rows) or bool(self._ended)

    def split(self, job_ids: Sequence[str], attempts: Sequence[int]) -> tuple[list[int], list[LogRow]]:
        """Indexes of ``job_ids`` held in the log at these attempts, and their rows."""
        found = [self.row(j, a) for j, a in zip(job_ids, attempts, strict=True)]
        idx = [i for i, w in enumerate(found) if w is not None]
        return idx, [w for w in found if w is not None]

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
