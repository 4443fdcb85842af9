"""Jobs whose producer did not know their actor's limits, keyed by the first worker that
claims them.

A producer writes a job's limit key and limits from its actor's options (bulk.flow_fields)
only when it has the actor: ``POST /api/v1/jobs``, ``supervisor jobs enqueue``, the
dashboard, or any program that sends by actor name without importing the actor's module
write a plain row, which the plain claim takes. Run as claimed, such a job would pass by
every limit its actor declares. The worker knows the actor: a plain row of an actor with
flow control is not run but written back as ``waiting`` with its key and limits (fenced by
owner and attempt, the claim not counted: sql.KEY_LATE then a requeue through sql.FINISH,
one transaction), so it waits for its key as if its producer had keyed it. A key its
message cannot fill fails that job alone, with the reason, as at send.

Such a job may be in the log too (055: a send by actor name, an SQL insert through the jobs
view), known there by its row's missing max_attempts (logstore.decode). Its attempt ends
'requeued' and it goes on keyed (slots.LOG_KEY_LATE): a key whose limits the log takes appended to the
log again with its key, any other into job_queue as a waiting row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dramatiq import Actor, Message

from ... import flow
from .. import bulk
from ..message import PgMessageProxy
from ..sql import KEYED_COLUMN

# A claimed row's concurrency_key column: a row written by hand with one took its slot in
# the claim, which a requeue would give up; it runs as claimed.
_CONCURRENCY_KEY_COLUMN = 6


@dataclass(frozen=True)
class LateKey:
    """A claimed message to write back as waiting on its actor's key."""

    message: PgMessageProxy
    flow_key: str
    flow: str
    concurrency_key: str | None


def planned(actors: Mapping[str, Actor[..., Any]]) -> frozenset[str]:
    """The names of the actors with flow control (a bad option raised at their definition)."""
    return frozenset(name for name, actor in actors.items() if bulk.actor_plan(actor) is not None)


def split(rows: list[tuple[Any, ...]], out: list[PgMessageProxy], actors: Mapping[str, Actor[..., Any]],
          with_limits: frozenset[str]) -> tuple[list[PgMessageProxy], list[LateKey], list[tuple[str, int, str]]]:
    """The claimed messages to run, those to write back keyed, and (id, attempt, why) of
    those whose key cannot be made."""
    # Rows of an actor with limits that came through the plain claim (column 2: the actor);
    # most claims have none, and hand their messages on untouched.
    unkeyed = {str(r[0]) for r in rows
               if r[2] in with_limits and not r[KEYED_COLUMN] and r[_CONCURRENCY_KEY_COLUMN] is None}
    if not unkeyed:
        return out, [], []
    return keyed(out, unkeyed, actors)


def split_log(out: list[PgMessageProxy], unbudgeted: set[str], actors: Mapping[str, Actor[..., Any]],
              with_limits: frozenset[str]) -> tuple[list[PgMessageProxy], list[LateKey], list[tuple[str, int, str]]]:
    """As ``split``, for claimed log messages: those whose row carried no max_attempts
    (``unbudgeted``: its writer did not know its actor, so did not key it) of an actor with
    limits are written back keyed."""
    unkeyed = {m.message_id for m in out if m.message_id in unbudgeted and m.actor_name in with_limits}
    if not unkeyed:
        return out, [], []
    return keyed(out, unkeyed, actors)


def keyed(out: list[PgMessageProxy], unkeyed: set[str], actors: Mapping[str, Actor[..., Any]]
          ) -> tuple[list[PgMessageProxy], list[LateKey], list[tuple[str, int, str]]]:
    """Of ``out``, the messages to run, the ``unkeyed`` ones to write back with their
    actor's key, and (id, attempt, why) of those whose key cannot be made."""
    run: list[PgMessageProxy] = []
    late: list[LateKey] = []
    bad: list[tuple[str, int, str]] = []
    for m in out:
        if m.message_id not in unkeyed:
            run.append(m)
            continue
        sent: Message[Any] = Message(queue_name=m.queue_name, actor_name=m.actor_name, args=m.args,
                                     kwargs=m.kwargs, options=m.options, message_id=m.message_id,
                                     message_timestamp=m.message_timestamp)
        message, concurrency_key, flow_key, limits = bulk.flow_fields(sent, actors[m.actor_name])
        if flow_key is not None:
            late.append(LateKey(m, flow_key, limits, concurrency_key))
        elif flow.KEY_ERROR in message.options:
            bad.append((m.message_id, m.attempts,
                        f"its limit key could not be made: {message.options[flow.KEY_ERROR]}"))
        else:
            run.append(m)
    return run, late, bad


def log_params(owner: str, late: list[LateKey]) -> dict[str, Any]:
    """slots.LOG_KEY_LATE's parameters: each claimed row, its key and limits, and the
    budget its actor gives it (written on the row it goes on as)."""
    rows = [k.message.log_row for k in late]
    return {"owner": owner, "seqs": [r.seq for r in rows], "days": [r.day for r in rows],
            "batches": [r.batch for r in rows], "keys": [k.flow_key for k in late], "flows": [k.flow for k in late],
            "concurrency_keys": [k.concurrency_key for k in late],
            "max_attempts": [k.message.max_attempts for k in late]}


def params(owner: str, late: list[LateKey]) -> dict[str, Any]:
    """sql.KEY_LATE's parameters."""
    return {"owner": owner,
            "ids": [k.message.message_id for k in late], "attempts": [k.message.attempts for k in late],
            "keys": [k.flow_key for k in late], "flows": [k.flow for k in late],
            "concurrency_keys": [k.concurrency_key for k in late]}
