"""A producer's log jobs with a dedupe key (migration 052, sql/jobkeys.py): each key's first
row of a send, its key taken as it is written, and the messages given their key's holder.

A key a live job holds (in the log, job_timers or job_queue) is not taken: its rows are not
written and their messages come back carrying that job's id, as job_queue's unique index
did for them before. A key repeated in one send is taken by its first row (its first
message, as bulk.enqueue_many keeps); the others get that row's holder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from dramatiq.message import Message

from .. import logstore
from ..sql import jobkeys


def split(rows: Sequence[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The plain rows, and each key's first row (ids in PostgreSQL's text form, each once)."""
    plain: list[tuple[Any, ...]] = []
    first: dict[Any, tuple[Any, ...]] = {}
    for r in logstore.unique_rows(rows):
        key = logstore.key_of(r)
        if key is None:
            plain.append(r)
        else:
            first.setdefault(key, r)
    return plain, list(first.values())


def take(conn: psycopg.Connection, first: list[tuple[Any, ...]], *, copy: bool, again: bool,
         delay_ms: int) -> dict[Any, str]:
    """Take the keys of ``first`` (split's) and, unless ``copy`` (the COPY writes the rows
    whose key went to them: ``kept``), write those rows in the same statement, to the log or,
    delayed, to job_timers; each key's holder."""
    if copy:
        params: dict[str, Any] = {"keys": [logstore.key_of(r) for r in first], "ids": [r[0] for r in first]}
        return dict(conn.execute(jobkeys.TAKE_KEYS, params).fetchall())
    if delay_ms:
        statement = jobkeys.TIMER_INSERT_KEYED_AGAIN if again else jobkeys.TIMER_INSERT_KEYED
    else:
        statement = jobkeys.LOG_INSERT_KEYED_AGAIN if again else jobkeys.LOG_INSERT_KEYED
    rows = [logstore.keyed_row(r) for r in first]
    return dict(conn.execute(statement, {**logstore.insert_params(rows), "delay_ms": delay_ms}).fetchall())


def kept(rows: Sequence[tuple[Any, ...]], holders: dict[Any, str]) -> list[tuple[Any, ...]]:
    """``rows`` (in the order sent, ids in text form) less the keyed ones whose key another
    job holds, and less a key's rows after its first."""
    out = []
    seen = set()
    for r in logstore.unique_rows(rows):
        key = logstore.key_of(r)
        if key is None:
            out.append(r)
        elif key not in seen:
            seen.add(key)
            if holders.get(key) == r[0]:
                out.append(r)
    return out


def holding(message: Message[Any], row: tuple[Any, ...] | None, holders: dict[Any, str]) -> Message[Any]:
    """``message`` as its sender gets it back: carrying the id of its key's holder when that
    is another job."""
    key = None if row is None else logstore.key_of(row)
    holder = None if key is None else holders.get(key)
    if holder is None or holder == message.message_id:
        return message
    return dataclasses.replace(message, message_id=holder)


def beside_table(rows: list[tuple[Any, ...] | None], messages: Sequence[Message[Any]],
                 key: Callable[[Message[Any]], Any]) -> list[tuple[Any, ...] | None]:
    """A batch's log rows (None: the message goes to job_queue), with a keyed row whose key a
    job_queue message of the same batch has sent to job_queue too: there the batch's first
    message of a key gets it (bulk.enqueue_many), as before the log took keys. ``key``: a
    message's dedupe key."""
    if all(r is not None for r in rows):
        return rows
    table = {key(m) for m, r in zip(messages, rows, strict=True) if r is None} - {None}
    return [None if r is not None and logstore.key_of(r) in table else r for r in rows]
