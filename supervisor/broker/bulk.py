"""Bulk enqueue (``PostgresBroker.enqueue_many``): many messages, one transaction, COPY.

A batch becomes one tuple per message (``sql.BULK_COLUMNS``), built with each
actor's options looked up once and empty args, kwargs and options not encoded.

A batch of ``COPY_MIN_ROWS`` or more streams into ``jobs`` with ``COPY ... FROM
STDIN`` inside a savepoint of the caller's transaction (or a transaction of its
own): no arrays for the server to parse, no ON CONFLICT probe per row. Dedupe
keys are settled first: a key repeated within the batch is written once (its
first message's row), and keys that already have a live job are looked up and
left out, so those messages come back carrying the live job's id, as with a
single ``enqueue``. A COPY that still meets a unique violation (a message id
already in the table, a key that went live meanwhile) is rolled back to the
savepoint and the batch goes through INSERT_MANY (ON CONFLICT DO NOTHING), the
one-statement path every smaller batch takes.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import psycopg
from dramatiq.message import Message
from psycopg.pq import TransactionStatus

from .. import flow
from . import sql
from .message import body_text, readable_body

if TYPE_CHECKING:
    from dramatiq import Actor

    from .middleware import Retries

# From this many rows COPY is the faster path, despite its three more round trips
# (BEGIN or SAVEPOINT, COPY's start, COMMIT or RELEASE): the two break even near 16
# rows, in and outside a caller's transaction; at 128 COPY takes 0.6 x the time.
COPY_MIN_ROWS = 32

# A row's dedupe key (its index in sql.BULK_COLUMNS); its limit key and limits follow the
# BULK_COLUMNS (sql.FLOW_COLUMNS).
ACTOR = 2
KEY = 9
CONCURRENCY_KEY = 10
STAMP = 11
FLOW_KEY = 12

# The message options job_fields reads; a message with none of them has its actor's fields.
_FIELD_OPTIONS = frozenset({"priority", "max_attempts", "max_retries", "dedupe_key"})

# Each actor's flow control (supervisor/flow.py), planned once (None: it has none).
_plans: weakref.WeakKeyDictionary[Any, flow.Plan | None] = weakref.WeakKeyDictionary()


def actor_plan(actor: Actor[..., Any]) -> flow.Plan | None:
    """The flow control an actor's options declare; LimitOptionError if one is bad."""
    try:
        return _plans[actor]
    except KeyError:
        found = _plans[actor] = flow.plan(actor.actor_name, actor.options, getattr(actor, "fn", None))
        return found


def flow_fields(message: Message[Any], actor: Actor[..., Any] | None) -> tuple[Message[Any], Any, Any, Any]:
    """A new row's message, concurrency_key, flow_key and flow (JSON text), from the
    message's flow options over its actor's. A bad option raises LimitOptionError (the
    send fails); a key this message cannot fill makes a row with no key that fails at its
    claim with the reason (flow.KEY_ERROR in its options)."""
    options = message.options
    if options and not flow.OPTIONS.isdisjoint(options):
        plan = flow.merged_plan(message.actor_name, actor.options if actor is not None else {}, options,
                                getattr(actor, "fn", None))
    else:
        plan = actor_plan(actor) if actor is not None else None
    if plan is None:
        return message, None, None, None
    try:
        key = plan.key_for(message)
    except ValueError as exc:
        return dataclasses.replace(message, options={**options, flow.KEY_ERROR: str(exc)}), None, None, None
    # concurrency_key keeps naming the key of a concurrency-limited job (searches, the API)
    return message, key if plan.limits.concurrency is not None else None, key, plan.limits.json


def job_fields(message: Message[Any], actor: Actor[..., Any] | None, retries: Retries | None,
               priorities: dict[str, int] | None = None) -> tuple[int, int | None, Any]:
    """priority, max_attempts and dedupe_key of a new row: the message's option, else its
    actor's; the priority is else its queue's role's (``priorities``, from the config),
    else 0. max_attempts is else the Retries budget; NULL for an actor this process does
    not know (enqueued by name from elsewhere): the worker that claims it applies its
    actor's budget."""
    options = message.options
    actor_options = actor.options if actor is not None else {}

    def option(name: str) -> Any:
        value = options.get(name)
        return actor_options.get(name) if value is None else value

    max_attempts = option("max_attempts")
    if max_attempts is None and actor is not None:
        max_attempts = 1 if retries is None else retries.max_attempts_for(message, actor)
    priority = options.get("priority")
    if priority is None:
        priority = (priorities or {}).get(message.queue_name, 0)
    return int(priority), None if max_attempts is None else int(max_attempts), option("dedupe_key")


def lease_budget(message: Message[Any], actor: Actor[..., Any] | None) -> int | None:
    """max_lease_losses of a new row: the message's option, else its actor's; None for the
    default's (the log's rows carry it, since a release by any process spends it; job_queue's
    claim reads it from the options or the claimer's actor)."""
    budget = message.options.get("max_lease_losses")
    if budget is None and actor is not None:
        budget = actor.options.get("max_lease_losses")
    return budget


def rows(messages: Iterable[Message[Any]], actors: dict[str, Actor[..., Any]], retries: Retries | None,
         priorities: dict[str, int] | None = None) -> list[tuple[Any, ...]]:
    """One tuple per message, in sql.BULK_COLUMNS then sql.FLOW_COLUMNS order (``actors``:
    the broker's)."""
    readable = readable_body()
    by_actor: dict[tuple[str, str], tuple[int, int | None, Any]] = {}
    out = []
    for m in messages:
        name = m.actor_name
        actor = actors.get(name)
        own = bool(m.options) and not _FIELD_OPTIONS.isdisjoint(m.options)  # else its actor's fields
        fields = None if own else by_actor.get((name, m.queue_name))
        if fields is None:
            fields = job_fields(m, actor, retries, priorities)
            if not own:
                by_actor[name, m.queue_name] = fields
        m, concurrency_key, flow_key, limits = flow_fields(m, actor)
        out.append((m.message_id, m.queue_name, name, *body_text(m, readable), *fields, concurrency_key,
                    m.message_timestamp, flow_key, limits))
    return out


def enqueue_many(conn: psycopg.Connection, messages: list[Message[Any]], *,
                 actors: dict[str, Actor[..., Any]], retries: Retries | None, delay: int = 0,
                 copy: bool | None = None, priorities: dict[str, int] | None = None) -> list[Message[Any]]:
    """Write ``messages`` as jobs due in ``delay`` ms; return them in order, a
    message whose dedupe key has a live job (or an earlier message of the batch)
    carrying that job's id. ``copy``: None picks by batch size; True or False
    forces COPY or INSERT_MANY (the benchmark compares them)."""
    batch = rows(messages, actors, retries, priorities)
    first: dict[Any, int] = {}  # dedupe key -> index of the first row carrying it
    write = []
    for i, row in enumerate(batch):
        key = row[KEY]
        if key is None:
            write.append(row)
        elif key not in first:
            first[key] = i
            write.append(row)
    # In id order, each row's index entries land next to the previous row's: the
    # claim index and (created_at, id) share every key column but the id within a
    # batch. It halves the server's work for a large batch (bench/README.md); the
    # claim order (priority, run_at, id) never depended on the order of the batch.
    write.sort(key=itemgetter(0))
    use_copy = len(write) >= COPY_MIN_ROWS if copy is None else copy
    live = _copy(conn, write, list(first), delay) if use_copy else None
    if live is None:
        live = _insert(conn, write, delay)
    if not first:
        return messages
    out = []
    for message, row in zip(messages, batch, strict=True):
        key = row[KEY]
        if key is not None:
            job_id = live.get(key) or batch[first[key]][0]
            if job_id != message.message_id:
                message = dataclasses.replace(message, message_id=job_id)
        out.append(message)
    return out


def _insert(conn: psycopg.Connection, write: list[tuple[Any, ...]], delay: int) -> dict[Any, str]:
    """INSERT_MANY; the live job of each key whose row was not inserted."""
    if not write:
        return {}
    columns = list(map(list, zip(*write, strict=True)))
    if not any(columns[FLOW_KEY]):  # no row waits for a limit key: NULL arrays (unnest pads them)
        columns[FLOW_KEY] = columns[FLOW_KEY + 1] = None  # type: ignore[call-overload]
    inserted = {str(r[0]) for r in conn.execute(sql.INSERT_MANY, [delay, *columns])}
    skipped = [r[KEY] for r in write if r[KEY] is not None and r[0] not in inserted]
    return _live(conn, skipped) if skipped else {}


def _live(conn: psycopg.Connection, keys: list[Any]) -> dict[Any, str]:
    return {key: str(job) for key, job in conn.execute(sql.LIVE_BY_DEDUPE_KEYS, {"keys": keys})}


def _copy(conn: psycopg.Connection, write: list[tuple[Any, ...]], keys: list[Any], delay: int) -> dict[Any, str] | None:
    """COPY the rows whose key has no live job; the live job of each key that has one.
    None: nothing written, use INSERT_MANY (run_at is past Python's year 9999)."""
    if conn.info.transaction_status == TransactionStatus.IDLE and not conn.autocommit:
        # Begin the caller's transaction (its first statement would): psycopg commits
        # a transaction() block that began one, and the jobs must wait for the caller.
        conn.execute("SELECT 1")
    live: dict[Any, str] = {}
    try:
        # Ours on an autocommit connection outside a transaction, else a savepoint.
        with conn.transaction():
            keyed = any(r[FLOW_KEY] is not None for r in write)
            statement = sql.COPY_FLOW_JOBS if keyed else sql.COPY_JOBS
            run_at: tuple[str, ...] = ()  # its default, now()
            if delay:
                try:
                    run_at = (conn.execute(sql.RUN_AT, [delay]).fetchone()[0].isoformat(),)  # type: ignore[index]
                except psycopg.DataError:
                    return None
                statement = sql.COPY_FLOW_JOBS_AT if keyed else sql.COPY_JOBS_AT
            if keys:
                live = _live(conn, keys)
                if live:
                    write = [r for r in write if r[KEY] not in live]
            with conn.cursor() as cur, cur.copy(statement) as rows_in:
                for row in write:
                    if keyed:  # with its status: a row with a limit key waits for it
                        rows_in.write_row(row + ("pending" if row[FLOW_KEY] is None else "waiting",) + run_at)
                    else:
                        rows_in.write_row(row[:FLOW_KEY] + run_at)
    except psycopg.errors.UniqueViolation:
        return live | _insert(conn, write, delay)
    return live
