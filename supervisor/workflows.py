"""``supervisor.workflow``: durable workflows, graphs of messages with dependencies.

    wf = supervisor.workflow("nightly", on_failure="cancel_rest")   # or "continue"
    a = wf.add(extract.message(1))
    b = wf.add(score.message(), after=[a])
    c = wf.add(score.message(), after=[a])
    d = wf.add(report.message(), after=[b, c])   # report(..., [result of b, result of c])
    wf.send()            # or, in a transaction of yours: with broker.transaction(conn): wf.send()
    wf.wait(timeout=60)  # "succeeded"; wf.results()[d] is report's result

Every step and edge is written in one transaction at send (the caller's, when it has one:
nothing runs unless it commits). A step runs once all its parents succeeded, released by
its last parent's outcome write in SQL (migration 049); it receives its parents' results as
one last argument, a list in the order of ``after``. A step that fails for good (retries
spent, cancelled, its lease-loss budget spent) cancels every step not yet started
(``cancel_rest``) or only its descendants (``continue``). docs/workflows.md has the rest.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import dramatiq
import psycopg
from dramatiq.message import Message

from .broker.middleware import WORKFLOW
from .broker.producing import workflow as writing
from .broker.sql import workflows as sql

POLICIES = ("cancel_rest", "continue")
ENDED = ("succeeded", "failed", "cancelled")


class Workflow:
    """A workflow being built (``add``), then sent once (``send``, or ``run``)."""

    def __init__(self, name: str, *, on_failure: str = "cancel_rest", broker: Any = None) -> None:
        if on_failure not in POLICIES:
            raise ValueError(f"on_failure must be one of {', '.join(POLICIES)}, not {on_failure!r}")
        self.id = str(uuid.uuid4())
        self.name = name
        self.policy = on_failure
        self._broker = broker
        self._messages: list[Message[Any]] = []
        self._parents: list[list[str]] = []
        self._sent = False

    @property
    def broker(self) -> Any:
        return self._broker or dramatiq.get_broker()

    def add(self, message: Message[Any], *, after: Sequence[str | Message[Any]] = ()) -> str:
        """Add a step (a message); it runs once every step of ``after`` (ids or the messages
        add returned them for) succeeded, and receives their results as its last argument.
        Returns the step's id (its message id, and its job's id)."""
        if self._sent:
            raise RuntimeError(f"workflow {self.name} was sent: add steps before send")
        known = {m.message_id for m in self._messages}
        parents = [p if isinstance(p, str) else p.message_id for p in after]
        for p in parents:
            if p not in known:
                raise ValueError(f"step {p} is not a step of workflow {self.name} (add it first)")
        if len(set(parents)) != len(parents):
            raise ValueError("a step is named twice in after=[...]")
        message = message.copy(message_id=str(uuid.uuid4()), options={**message.options, WORKFLOW: self.id})
        self._messages.append(message)
        self._parents.append(parents)
        return message.message_id

    def send(self, conn: psycopg.Connection | None = None) -> Workflow:
        """Write the workflow in one transaction (``conn``'s, or ``broker.transaction(conn)``'s
        when called inside one) and enqueue its root steps."""
        if not self._messages:
            raise ValueError(f"workflow {self.name} has no step")
        if self._sent:
            raise RuntimeError(f"workflow {self.name} was sent already")
        writing.send(self.broker, workflow=self.id, name=self.name, policy=self.policy, messages=self._messages,
                     parents=self._parents, conn=conn)
        self._sent = True
        return self

    run = send

    def state(self) -> str | None:
        with self.broker.pool.connection(timeout=10) as c:
            row = c.execute(sql.STATE, {"id": self.id}).fetchone()
            return None if row is None else str(row[0])

    def wait(self, timeout: float = 60.0) -> str:
        """Block until the workflow ended (its end NOTIFYs); its state. TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        url = self.broker.listen_url or self.broker.url
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"LISTEN {sql.CHANNEL}")
            while True:
                row = c.execute(sql.STATE, {"id": self.id}).fetchone()
                if row is not None and row[0] in ENDED:
                    return str(row[0])
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"workflow {self.name} ({self.id}) still {row and row[0]} after {timeout} s")
                # a notify of any workflow's end, or a look every second (a pooled URL hears none)
                for _ in c.notifies(timeout=min(remaining, 1.0)):
                    break

    def results(self) -> dict[str, Any]:
        """Each succeeded step's result, by step id."""
        with self.broker.pool.connection(timeout=10) as c:
            return {i: r for i, state, r in c.execute(sql.RESULTS, {"id": self.id}) if state == "succeeded"}


def workflow(name: str, *, on_failure: str = "cancel_rest", broker: Any = None) -> Workflow:
    """A new workflow named ``name`` (on the global broker unless ``broker``)."""
    return Workflow(name, on_failure=on_failure, broker=broker)

