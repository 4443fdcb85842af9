"""WorkflowSteps: a workflow step's result, where the end trigger of migration 049 finds it.

A step that succeeded hands its result to its children in SQL, in the transaction that writes
its outcome (workflow_steps_ended): a log job's result rides on its done row (as a stored
result does, ``log_result``: no round trip), a job_queue job's is written on its row before
the ack, whose archive copies it into job_history. A step's done row always carries a result
(JSON null for None): that is what job_done's end trigger looks for before it reads anything,
so a plain job's ack pays nothing for workflows. Failures need nothing here: every end that is
not a success reaches the triggers whether or not a middleware ran.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware

from ..message import jsonb
from ..middleware import WORKFLOW
from ..sql import workflows as sql


def as_json(value: Any) -> Any:
    """A step's result as its children receive it and jobs.result shows it: the value itself
    when it is JSON, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)}
    return value


class WorkflowSteps(Middleware):
    """Puts a successful workflow step's result where its outcome's write carries it."""

    # A job without the workflow option (signals.PLAN_KEYS holds it) is no step.
    inert_when_planned: ClassVar[frozenset[str]] = frozenset({"after_process_message"})

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if (WORKFLOW not in message.options or exception is not None or message.failed
                or getattr(message, "fenced", None)):
            return
        value = jsonb(as_json(result))
        if getattr(message, "log_row", None) is not None:
            message.log_result = value  # type: ignore[attr-defined]  # a PgMessageProxy's
            return
        with broker.pool.connection(timeout=10) as c:  # type: ignore[attr-defined]  # a PostgresBroker's
            c.execute(sql.STEP_RESULT, {"id": message.message_id, "result": value})
