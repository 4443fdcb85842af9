"""The claim side of PostgresBroker (``broker.claims``): a claim of the log and of
job_queue, in the order the broker's storage says, and what a claim learns (flow
control's late keys and gates, the floors of floors.py)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from dramatiq.errors import ActorNotFound, BrokerConnectionError

from ... import defaults
from .. import logstore, sql
from ..connections import Connections
from ..joining import Failures
from ..message import PgMessageProxy, decode_claimed
from ..middleware import Retries, claim_budgets, row_budget
from ..sql import slots, timers
from . import late_keys
from .background import Background
from .completer import Finish
from .floors import ClaimFloors
from .gates import Gates
from .leases import Leases
from .timer_floors import TimerFloors

T = TypeVar("T")
# How long a claim waits for a connection while claims are failing (see Claims._claiming).
CLAIM_TIMEOUT_IN_OUTAGE = 0.25


class Claims:
    """Claims rows for this process's consumers (``claim``): leases them to ``owner``
    (``leases``; the log's batches in ``batches``), keeps each queue's floor and gate,
    and writes back at once what a claim cannot run (late keys through ``finish``,
    unreadable rows through the leases). Its own state: the turn between the log and
    job_queue, whether claims are failing, and its caches of the actors' budgets."""

    def __init__(self, connections: Connections, owner: str, *, lease_seconds: float, leases: Leases,
                 batches: logstore.Batches, floors: ClaimFloors, gates: Gates, failures: Failures,
                 actors: dict[str, Any], handback: threading.RLock, retries: Callable[[], Retries | None],
                 finish: Callable[[psycopg.Connection, Sequence[Finish]], int], background: Background) -> None:
        self.connections = connections
        self.pool = connections.pool
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.leases = leases
        self.batches = batches
        self.floors = floors
        self.gates = gates
        self.failures = failures
        self.actors = actors  # dramatiq's Broker's: the declared actors by name (the same dict)
        self.background = background  # its listener and timer, once started: a claim's word on limit keys
        self._handback = handback  # see PostgresBroker.__init__
        self._retries = retries
        self._finish = finish
        self.timer_floors = TimerFloors()  # where each queue's promotion reads job_timers from
        self._log_turn = 0  # claims since this process last asked job_queue (claim)
        self._claims_failing = False
        self._budget_cache: tuple[int, dict[str, Any]] | None = None
        self._limited_cache: tuple[int, frozenset[str]] | None = None

    def _budgets(self) -> dict[str, Any]:
        """Each known actor's exception and lease-loss budgets, for rows that carry none
        (computed again only when an actor was declared since)."""
        if self._budget_cache is None or self._budget_cache[0] != len(self.actors):
            self._budget_cache = (len(self.actors), claim_budgets(self.actors, self._retries()))
        return self._budget_cache[1]

    def claim(self, queue: str, n: int, *, idle: bool = False) -> list[PgMessageProxy]:
        """Claim up to n rows; ``idle`` when the previous claim found the queue short.

        A row that cannot become a message fails at once, alone; only the others
        are returned (the consumer frees the capacity the bad ones reserved).

        The log's rows, and job_queue's only when the log had none (one statement a claim
        while the log has work: a woken consumer's job starts after one round trip), or
        first at every LOG_TABLE_TURN-th claim, so job_queue's rows (the keyed jobs the log
        does not take yet, an older version's) are never starved by a log that always has
        more."""
        self._log_turn += 1
        if self._log_turn % defaults.LOG_TABLE_TURN == 0:
            out = self._claim_table(queue, n, idle)
            return out + self._claim_log(queue, n - len(out), idle) if len(out) < n else out
        return self._claim_log(queue, n, idle) or self._claim_table(queue, n, idle)

    def _claiming(self, statement: Callable[[psycopg.Connection], T]) -> T:
        """A claim's statement on the pool, as an outage wants it (see claim)."""
        # In an outage, ask for a connection only briefly: the consumer tries again
        # at once, and each try makes the pool attempt a fresh connection.
        timeout = CLAIM_TIMEOUT_IN_OUTAGE if self._claims_failing else 10.0
        try:
            with self.connections.connection(own=True, timeout=timeout) as c:
                result = statement(c)
        except BrokerConnectionError:
            self._claims_failing = True
            self.leases.may_have_orphaned()  # the claim may have committed with its answer lost
            with contextlib.suppress(Exception):
                self.pool.check()  # drop every broken idle connection now, not one per try
            raise
        self._claims_failing = False
        return result

    def _claim_log(self, queue: str, n: int, idle: bool) -> list[PgMessageProxy]:
        """Up to n rows of the queue's log, as one leased batch (``idle``: see claim), its
        due timers promoted into the log first in the same statement (timers.LOG_CLAIM_DUE,
        read from the queue's floor: timer_floors.py). The rows a claim promotes are mostly past
        its own windows' snapshot (its transaction's): one that promoted and took nothing is
        followed by another at once, which takes them (a delayed job starts one round trip
        later than a plain one); one that promoted and took rows wakes the queue's consumer,
        whose next claim takes the rest."""
        for _ in range(2):
            params = {"queue": queue, "n": n, "owner": self.owner, "lease_s": self.lease_seconds, "relaxed": idle,
                      **self.timer_floors.params(queue)}
            sent = time.monotonic()
            rows = self._claiming(functools.partial(_claim_due, params=params))
            if not rows:
                return []
            self.timer_floors.read(queue, rows[0][timers.UPTO_COLUMN], full=params["tfloor"] is None,
                                   took_s=time.monotonic() - sent)
            promoted = rows[0][timers.PROMOTED_COLUMN]
            if rows[0][0] is not None or not promoted:
                break
        if rows[0][0] is None:  # took nothing (the row only says what it promoted)
            return []
        if promoted and self.background.listener is not None:
            self.background.listener.event_for(queue).set()
        budgets = self._budgets()
        out, bad, unbudgeted = logstore.decode(rows, self.actors, lambda m: row_budget(
            m.options, budgets["by_actor"].get(m.actor_name), budgets["default_max_attempts"]))
        late: list[late_keys.LateKey] = []
        if unbudgeted and self._with_limits():  # rows written by one who did not know their actor (055)
            claimed = {m.message_id: m for m in out}
            out, late, unkeyable = late_keys.split_log(out, unbudgeted, self.actors, self._with_limits())
            bad += [(job_id, attempt, why, claimed[job_id].log_row) for job_id, attempt, why in unkeyable]
        held = [*out, *(k.message for k in late)]
        with self._handback:
            self.batches.hold([(m.message_id, m.log_row) for m in held] + [(b[0], b[3]) for b in bad])
            self.leases.hold([(m.message_id, m.attempts) for m in held], since=sent)
        if late:
            self._key_late_log(late)
        if bad:
            self.leases.fail_unreadable([b[:3] for b in bad])
            for job_id, _, _, _ in bad:
                actor = next(str(r[5]) for r in rows if str(r[3]) == job_id)
                if actor not in self.actors:
                    self.failures.record(job_id, ActorNotFound(actor))
        return out

    def _claim_table(self, queue: str, n: int, idle: bool) -> list[PgMessageProxy]:
        """Up to n rows of the queue in job_queue (sql.claim)."""
        floors, sweep = self.floors.params(queue)
        params = {"queue": queue, "n": n, "owner": self.owner, "lease_s": self.lease_seconds, "relaxed": idle,
                  **self._budgets(), **self.gates.params(queue, n), **floors}
        sent = time.monotonic()
        keyed, probe = self.gates.statement(queue)
        rows = self._claiming(lambda c: c.execute(sql.claim(n, keyed=keyed, probe=probe), params).fetchall())
        if rows and rows[0][0] is None:  # the keyed part's META row (sql/flow.py)
            self._gated(queue, n, rows.pop(0))
        self.floors.claimed(queue, rows, sweep, time.monotonic() - sent)
        out, bad = decode_claimed(rows, self.actors)
        late: list[late_keys.LateKey] = []
        with_limits = self._with_limits()
        if with_limits:
            out, late, unkeyable = late_keys.split(rows, out, self.actors, with_limits)
            bad += unkeyable
        with self._handback:
            self.leases.hold([(m.message_id, m.attempts) for m in (*out, *(k.message for k in late))], since=sent)
        if late:
            self._key_late(late)
        if bad:
            self.leases.fail_unreadable(bad)
            failed = {job_id for job_id, _, _ in bad}
            for row in rows:  # join(fail_fast) raises what Dramatiq's worker would have met
                if str(row[0]) in failed and row[2] not in self.actors:
                    self.failures.record(str(row[0]), ActorNotFound(row[2]))
        return out

    def _with_limits(self) -> frozenset[str]:
        """The actors this process knows that have flow control (again only when an actor
        was declared since)."""
        if self._limited_cache is None or self._limited_cache[0] != len(self.actors):
            self._limited_cache = (len(self.actors), late_keys.planned(self.actors))
        return self._limited_cache[1]

    def _key_late(self, late: list[late_keys.LateKey]) -> None:
        """Claimed rows their producer did not key: written back waiting on their actor's key."""
        rows = [Finish(k.message.message_id, k.message.attempts, "requeue",
                       reason="keyed by its actor's limits (its producer did not know them)") for k in late]
        with self._handback:
            with self.connections.connection(own=True) as c, c.transaction():
                c.execute(sql.KEY_LATE, late_keys.params(self.owner, late))
                self._finish(c, rows)
            self.leases.let_go(*(k.message.message_id for k in late))

    def _key_late_log(self, late: list[late_keys.LateKey]) -> None:
        """Claimed log rows their writer did not key: their attempt ended, each going on
        keyed (slots.LOG_KEY_LATE: the log again, or job_queue), in one statement."""
        ids = [k.message.message_id for k in late]
        with self._handback:
            with self.connections.connection(own=True) as c, c.transaction():
                c.execute(slots.LOG_KEY_LATE, late_keys.log_params(self.owner, late))
            self.batches.written(ids)
            self.leases.let_go(*ids)

    def _gated(self, queue: str, n: int, meta: tuple[Any, ...]) -> None:
        """A claim's word on the queue's limit keys: whether it has waiting rows, where its
        next turn starts, and when a gated key opens (0: the plain claim saw waiting rows,
        or the keyed one could not reach every key or left rows: claim again now)."""
        wait, cursor = meta[sql.WAIT_COLUMN], meta[sql.CURSOR_COLUMN]
        self.gates.learned(queue, n, wait, cursor, meta[sql.KEYS_COLUMN], meta[sql.TOOK_COLUMN])
        if wait is None:
            return
        if wait <= 0:
            if self.background.listener is not None:
                self.background.listener.event_for(queue).set()
        elif self.background.timer is not None:
            self.background.timer.due_in(queue, float(wait))


def _claim_due(c: psycopg.Connection, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """timers.LOG_CLAIM_DUE's rows (a claim of the log, its due timers promoted first)."""
    return c.execute(timers.LOG_CLAIM_DUE, params).fetchall()
