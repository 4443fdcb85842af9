"""The producer side of PostgresBroker (``broker.producer``): a message becomes a row of
the job log (every kind: plain, deduped, or with a limit key: a concurrency limit, a rate,
a daily quota, a fairness weight; one of an actor this process does not know, its budget
filled in by the worker that claims it) or of job_timers (one with a delay, promoted into
the log at its run_at), in the caller's transaction or in
one of its own written again on a fresh connection if the server ends it (sending.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import psycopg
from dramatiq.message import Message

from ... import defaults
from .. import bulk, logstore, tracing
from ..connections import Connections, callers_transaction
from ..message import PgMessageProxy, body_columns, body_text, readable_body
from ..middleware import Retries
from ..signals import Emit
from ..sql import joblog, slots, timers
from . import dedupe, sending

T = TypeVar("T")

class Producer:
    """Sends for any process: given the broker's ``connections``, the
    declared ``actors`` and the queues' default priorities, its Retries middleware
    (``retries``: looked up per send, the list may change), where a retried proxy goes
    (``retry``: the worker's outcomes) and the middleware signals of a send."""

    def __init__(self, connections: Connections, *, actors: dict[str, Any],
                 queue_priorities: dict[str, int], retries: Callable[[], Retries | None],
                 retry: Callable[[PgMessageProxy, int | None], PgMessageProxy], emit_before: Emit,
                 emit_after: Emit) -> None:
        self.connections = connections
        self.actors = actors  # dramatiq's Broker's: the declared actors by name (the same dict)
        self.queue_priorities = queue_priorities
        self.retries = retries
        self._retry = retry
        self._emit_before = emit_before
        self._emit_after = emit_after

    def _row(self, message: Message[Any], delay: int | None) -> dict[str, Any]:
        actor = self.actors.get(message.actor_name)
        priority, max_attempts, dedupe_key = bulk.job_fields(message, actor, self.retries(), self.queue_priorities)
        message, concurrency_key, flow_key, limits = bulk.flow_fields(message, actor)
        return {
            "id": message.message_id,
            "queue": message.queue_name,
            "actor": message.actor_name,
            **body_columns(message),
            "message_timestamp": message.message_timestamp,
            "priority": priority,
            "delay_ms": int(delay or 0),
            "max_attempts": max_attempts,
            "max_lease_losses": bulk.lease_budget(message, actor),
            "dedupe_key": dedupe_key,
            "concurrency_key": concurrency_key,
            "flow_key": flow_key,
            "flow": limits,
        }

    def _log_rows(self, messages: list[Message[Any]], *, keyed: bool = False) -> list[tuple[Any, ...] | None]:
        """Each message's log row (logstore.log_row), None for one the log does not take (a
        limit key with a fairness weight or no limit, or any limit key unless ``keyed``; an
        actor this process does not know goes to the log, 055). A message with no options of its own has its actor's and queue's fields:
        those are worked out once per actor and queue (``_plain_fields``), the rest of its
        row is its id, body and stamp; any other message's row is built as bulk.rows builds
        job_queue's."""
        retries = self.retries()
        readable = readable_body()
        plain: dict[tuple[str, str], tuple[Any, ...] | None] = {}
        out: list[tuple[Any, ...] | None] = []
        rest: list[int] = []  # messages with options of their own
        for i, m in enumerate(messages):
            fields = None if m.options else self._cached_plain_fields(m, plain, retries)
            if fields is None:
                rest.append(i)
                out.append(None)
            else:
                out.append((m.message_id, m.queue_name, m.actor_name, *body_text(m, readable), *fields,
                            m.message_timestamp))
        if rest:
            for i, row in zip(rest, self._general_log_rows([messages[i] for i in rest], retries, keyed=keyed),
                              strict=True):
                out[i] = row
        return out

    def _all_plain(self, messages: list[Message[Any]]) -> bool:
        """Whether every message's log row is a plain one of ``_log_rows`` (no options of its
        own, an actor and queue whose rows the log takes)."""
        retries = self.retries()
        plain: dict[tuple[str, str], tuple[Any, ...] | None] = {}
        return all(not m.options and self._cached_plain_fields(m, plain, retries) is not None for m in messages)

    def _cached_plain_fields(self, message: Message[Any], cache: dict[tuple[str, str], tuple[Any, ...] | None],
                             retries: Retries | None) -> tuple[Any, ...] | None:
        """``_plain_fields`` of the message's actor and queue, worked out once per ``cache``."""
        where = (message.actor_name, message.queue_name)
        if where not in cache:
            cache[where] = self._plain_fields(message, retries)
        return cache[where]

    def _plain_fields(self, message: Message[Any], retries: Retries | None) -> tuple[Any, ...] | None:
        """priority, max_attempts and max_lease_losses of the log rows of messages with no
        options of their own to this message's actor and queue, taken from its general row;
        None when such a message does not go to the log, or its row depends on the message
        (the actor's flow control: its key is read from the message)."""
        actor = self.actors.get(message.actor_name)
        if actor is None or bulk.actor_plan(actor) is not None:
            return None
        (row,) = self._general_log_rows([message], retries)
        return None if row is None or logstore.key_of(row) is not None else row[7:10]  # (an actor's dedupe key)

    def _general_log_rows(self, messages: list[Message[Any]], retries: Retries | None, *, keyed: bool = False
                          ) -> list[tuple[Any, ...] | None]:
        actors = self.actors
        out: list[tuple[Any, ...] | None] = []
        for m, row in zip(messages, bulk.rows(messages, actors, retries, self.queue_priorities), strict=True):
            if not logstore.loggable(row, keyed=keyed):
                out.append(None)
                continue
            # (an actor this process does not know, 055: its row's max_attempts is its options',
            # else none, which the claiming worker fills in: logstore.decode)
            out.append(logstore.log_row(row, bulk.lease_budget(m, actors.get(m.actor_name))))
        return out

    def enqueue(
        self, message: Message[Any], *, delay: int | None = None, conn: psycopg.Connection | None = None
    ) -> Message[Any]:
        if isinstance(message, PgMessageProxy):
            # A retry: Retries hands the proxy back. dramatiq types enqueue Message -> Message only.
            return self._retry(message, delay)  # type: ignore[return-value]
        self._emit_before("enqueue", message, delay)
        with tracing.active.sending([message]) if tracing.active else contextlib.nullcontext():
            (logged,) = self._log_rows([message], keyed=True)
            if logged is not None:
                holders: dict[Any, str] = {}
                write = self._log_writer([logged], lambda c: message, atomic=False, delay_ms=int(delay or 0),
                                         holders=holders)
                message = self._send(write, conn, "enqueue 1 message")
                if holders:  # (a plain job's send crosses no module of the keys)
                    message = dedupe.holding(message, logged, holders)
            else:
                row = self._row(message, delay)
                message = self._send(lambda c: sending.insert_one(c, row, message), conn, "enqueue 1 message")
        self._emit_after("enqueue", message, delay)
        return message

    def _log_writer(self, rows: list[tuple[Any, ...]], rest: Callable[[psycopg.Connection], T], *,
                    atomic: bool = True, delay_ms: int = 0, holders: dict[Any, str] | None = None
                    ) -> Callable[[psycopg.Connection], T]:
        """A producer's write that appends ``rows`` (logstore.log_row) to the log, then does
        ``rest`` (the job_queue part, if any), in one transaction (``atomic``; else, with
        nothing in ``rest`` to write, no BEGIN and COMMIT of its own: the rows go in with one
        statement, a COPY's live-id check being a read before it, which READ COMMITTED would
        answer the same inside a transaction: two round trips of five); written again on a
        fresh connection, it appends only the rows the first write did not (sending.py). A
        large batch goes in with COPY (logstore.append), as job_queue's does
        (bulk.COPY_MIN_ROWS). Delayed (``delay_ms``), the rows wait in job_timers instead
        (timers.TIMER_INSERT, one statement of arrays) until a claim promotes them into the
        log at their run_at. Rows with a dedupe key (dedupe.py) take their keys as they are
        written, each key's first row only, in the same transaction as the rest; each key's
        holder (the row's own id, or the live job that has it) goes into ``holders``. Rows
        with a concurrency key and no dedupe key go in with slots.LOG_INSERT_KEYED (delayed:
        slots.TIMER_INSERT_KEYED), in the same transaction."""
        slotted = [r for r in rows if logstore.flow_keyed(r)]
        if slotted:
            rows = [r for r in rows if not logstore.flow_keyed(r)]
            slot_params = logstore.keyed_params(logstore.unique_rows(slotted))
            atomic = atomic or bool(rows)  # two statements: both, or neither
        copy = len(rows) >= bulk.COPY_MIN_ROWS and not delay_ms
        plain, first = dedupe.split(rows) if any(logstore.key_of(r) is not None for r in rows) else (rows, [])
        atomic = atomic or bool(first and (plain or copy))  # the keys taken and the rows, or neither
        params = None if copy or not plain else {**logstore.insert_params(logstore.unique_rows(plain)),
                                                 "delay_ms": delay_ms}
        tries = [0]

        def append(c: psycopg.Connection) -> None:
            tries[0] += 1
            again = tries[0] > 1
            if slotted and delay_ms:
                c.execute(slots.TIMER_INSERT_KEYED_AGAIN if again else slots.TIMER_INSERT_KEYED,
                          {**slot_params, "delay_ms": delay_ms})
            elif slotted:
                c.execute(slots.LOG_INSERT_KEYED_AGAIN if again else slots.LOG_INSERT_KEYED, slot_params)
            if first:
                took = dedupe.take(c, first, copy=copy, again=again, delay_ms=delay_ms)
                if holders is not None:
                    holders.clear()
                    holders.update(took)
                if copy:
                    logstore.append(c, dedupe.kept(rows, took), again=again)
                    return
            elif copy:
                logstore.append(c, rows, again=again)
                return
            if not plain:
                return
            if delay_ms:
                c.execute(timers.TIMER_INSERT if not again else timers.TIMER_INSERT_AGAIN, params)
                return
            statement = ((joblog.LOG_INSERT_ONE if len(plain) == 1 else joblog.LOG_INSERT) if not again
                         else joblog.LOG_INSERT_AGAIN)
            c.execute(statement, params)

        def write(c: psycopg.Connection) -> T:
            if not c.autocommit or not atomic:  # the caller's transaction, or one writing statement
                append(c)
                return rest(c)
            with c.transaction():  # both parts, or neither
                append(c)
                return rest(c)
        return write

    @staticmethod
    def _copy_writer(build: Callable[[], list[tuple[Any, ...] | None]], ids: list[str]
                     ) -> Callable[[psycopg.Connection], None]:
        """_log_writer's write for a batch of COPY's size whose every message is plain
        (``_all_plain``): the rows built (``build``) while the server checks the messages'
        ``ids`` (logstore.append), no job_queue part, so no transaction of its own."""
        tries = [0]

        def write(c: psycopg.Connection) -> None:
            tries[0] += 1
            logstore.append(c, lambda: [r for r in build() if r is not None], again=tries[0] > 1, ids=ids)
        return write

    def enqueue_many(
        self, messages: Iterable[Message[Any]], *, delay: int | None = None,
        conn: psycopg.Connection | None = None,
    ) -> list[Message[Any]]:
        """Write many messages at once, in one transaction (the caller's ``conn`` or
        ``transaction()``, else one of its own, written again on a fresh connection
        if the server ends it: see sending.py); large batches go in with COPY (see
        bulk.py). Messages whose dedupe key already has a live job, or repeats a
        key earlier in the batch, come back carrying that job's id."""
        messages = list(messages)
        if not messages:
            return []
        with tracing.active.sending(messages) if tracing.active else contextlib.nullcontext():
            return self._enqueue_many(messages, delay, conn)

    def _enqueue_many(self, messages: list[Message[Any]], delay: int | None,
                      conn: psycopg.Connection | None) -> list[Message[Any]]:
        what = f"enqueue {len(messages)} messages"
        if not delay and len(messages) >= bulk.COPY_MIN_ROWS and self._all_plain(messages):
            ids = [m.message_id for m in messages]
            self._send(self._copy_writer(lambda: self._log_rows(messages), ids), conn, what)
            return messages
        retries = self.retries()
        rows = self._log_rows(messages, keyed=True)
        if any(r is not None and logstore.key_of(r) is not None for r in rows):
            rows = dedupe.beside_table(rows, messages, lambda m: bulk.job_fields(
                m, self.actors.get(m.actor_name), retries, self.queue_priorities)[2])
        logged = [r for r in rows if r is not None]
        table = [m for m, r in zip(messages, rows, strict=True) if r is None] if logged else messages

        def write_table(c: psycopg.Connection) -> list[Message[Any]]:
            return bulk.enqueue_many(c, table, actors=self.actors, retries=retries, delay=int(delay or 0),
                                     priorities=self.queue_priorities) if table else []

        if not logged:
            return self._send(write_table, conn, what)
        delay_ms = int(delay or 0)
        holders: dict[Any, str] = {}
        if not table:
            self._send(self._log_writer(logged, lambda c: None, atomic=False, delay_ms=delay_ms, holders=holders),
                       conn, what)
            return [dedupe.holding(m, r, holders) for m, r in zip(messages, rows, strict=True)] if holders else messages
        written = iter(self._send(self._log_writer(logged, write_table, delay_ms=delay_ms, holders=holders), conn,
                                  what))
        # in the caller's order: a logged message as it came (a key's live holder's id if it has
        # one), a table one as bulk returns it
        return [(dedupe.holding(m, r, holders) if holders else m) if r is not None else next(written)
                for m, r in zip(messages, rows, strict=True)]

    def _send(self, write: Callable[[psycopg.Connection], T], conn: psycopg.Connection | None, what: str) -> T:
        """A producer's write: on the caller's connection (its transaction, never
        written again here: see sending.py), else on the pool's, again on a fresh one
        if the server ends it (BrokerConnectionError once that has not helped)."""
        callers = conn or callers_transaction.get()
        if callers is not None:
            return write(callers)
        return sending.write_retrying(self.connections.pool, self.connections.url, write, what,
                                      give_up_after=defaults.ENQUEUE_RETRY_SECONDS)
