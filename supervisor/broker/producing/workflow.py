"""Writing a workflow (supervisor/workflows.py): its row, every step's row and edges, and its
root steps' jobs, in one transaction: the caller's (``broker.transaction(conn)`` or ``conn``),
else one of the pool's. A step's row holds its message as the producer would write its job
(the columns bulk.rows gives job_queue's row, and whether the log would take it: a plain
step, one with a dedupe key or a limit key the log takes, 055), so the release
(migrations 049, 055: SQL where its last parent's outcome is written) needs no Python."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from dramatiq.message import Message

from ... import defaults
from .. import bulk, logstore
from ..connections import callers_transaction
from ..message import readable_body
from ..sql import workflows as sql


def step_params(broker: Any, workflow: str, messages: Sequence[Message[Any]],
                parents: Sequence[Sequence[str]]) -> dict[str, list[Any]]:
    """INSERT_STEPS's arrays for ``messages`` (in the order added) whose parents' ids are
    ``parents`` (each in its add(after=...) order)."""
    producer = broker.producer
    rows = bulk.rows(messages, producer.actors, producer.retries(), producer.queue_priorities)
    children: dict[str, list[str]] = {m.message_id: [] for m in messages}
    for m, ps in zip(messages, parents, strict=True):
        for p in ps:
            children[p].append(m.message_id)
    cols: dict[str, list[Any]] = {k: [] for k in (
        "id", "workflow", "position", "parents", "children", "remaining", "state", "to_log", "queue", "actor", "args",
        "kwargs", "options", "priority", "max_attempts", "max_lease_losses", "dedupe_key", "concurrency_key",
        "message_timestamp", "flow_key", "flow")}
    for i, (m, row, ps) in enumerate(zip(messages, rows, parents, strict=True)):
        (_id, queue, actor, args, kwargs, options, _payload, priority, max_attempts, dedupe_key, concurrency_key,
         message_timestamp, flow_key, flow) = row
        budget = bulk.lease_budget(m, producer.actors.get(actor))
        to_log = logstore.loggable(row, keyed=True)
        values = {
            "id": m.message_id, "workflow": workflow, "position": i, "parents": "{" + ",".join(ps) + "}",
            "children": "{" + ",".join(children[m.message_id]) + "}", "remaining": len(ps),
            "state": "blocked" if ps else "enqueued",
            # a keyed step too, if its limits are the log's (055's release takes its dedupe key)
            "to_log": to_log,
            "queue": queue, "actor": actor, "args": args, "kwargs": kwargs, "options": options,
            "priority": priority, "max_attempts": max_attempts, "max_lease_losses": budget,
            "dedupe_key": dedupe_key, "concurrency_key": concurrency_key, "message_timestamp": message_timestamp,
            "flow_key": flow_key, "flow": flow,
        }
        for k, v in values.items():
            cols[k].append(v)
    return cols


def send(broker: Any, *, workflow: str, name: str, policy: str, messages: Sequence[Message[Any]],
         parents: Sequence[Sequence[str]], conn: psycopg.Connection | None = None) -> None:
    """Write the workflow, its steps and its roots' jobs in one transaction."""
    if not readable_body():
        raise TypeError("workflows need Dramatiq's JSONEncoder (a step's parents' results are added to its "
                        "arguments in the database)")
    params = step_params(broker, workflow, messages, parents)
    roots = [m for m, ps in zip(messages, parents, strict=True) if not ps]
    head = {"id": workflow, "name": name, "policy": policy, "steps": len(messages)}

    def write(c: psycopg.Connection) -> None:
        c.execute(sql.INSERT_WORKFLOW, head)
        c.execute(sql.INSERT_STEPS, params)
        with broker.transaction(c):
            broker.enqueue_many(roots)

    callers = conn or callers_transaction.get()
    if callers is not None:
        write(callers)
        return

    # Not written again on a lost connection (as a batch is): whether the workflow went in is
    # for the caller to see (its id), and a second write would meet its primary key.
    with broker.pool.connection(timeout=defaults.ENQUEUE_RETRY_SECONDS) as c, c.transaction():
        write(c)

