"""Groups inside a pipeline (``supervisor.pipeline``): the fan-out to a group's members
and the fan-in of their results to the next step.

A pipeline's steps travel in the messages' options, as Dramatiq's ``pipe_target`` does:
a step is ``{"message": <message dict>}`` or ``{"group": {"id": <fan-in id>, "members":
[<message dict>, ...]}}``. A message whose next step is a group carries the group as
``pipe_fanout``; each member carries ``pipe_fanin`` (the fan-in's id, its own place, the
group's size and the step after the group, ``then``). Message to message stays Dramatiq's
``pipe_target``, run by Dramatiq's Pipelines middleware.

The fan-in is a row of ``pipeline_fanins`` and a result row per member, not the
rate-limiter backend: the results must be kept (the backend holds integers), in member
order, each member's once (a member run again after its process died writes nothing),
and a member that fails for good marks the fan-in failed, so the next step never goes.
The member whose arrival completes the count sends the next step in that transaction.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from .. import backoff, defaults
from .consuming.order import Before, Placement
from .limiter import CONNECTION_ERRORS, PostgresBackend
from .middleware import FANIN, FANOUT, Retries
from .sql import limiter as sql

log = logging.getLogger(__name__)

Step = dict[str, Any]  # {"message": ...} or {"group": {"id": ..., "members": [...]}}


def _piped(message: Message[Any], piped: tuple[Any, ...], ignore: bool) -> Message[Any]:
    """``message`` with the previous step's output as its last argument, unless it (or the
    step before, ``ignore``) says pipe_ignore, as Dramatiq's Pipelines decides."""
    if not piped or ignore or message.options.get("pipe_ignore"):
        return message
    return message.copy(args=tuple(message.args) + piped)


def send_step(broker: Broker, step: Step, *, piped: tuple[Any, ...] = (), ignore: bool = False,
              delay: int | None = None) -> None:
    """Send ``step`` (a message, or every member of a group in one transaction), each
    given ``piped`` (the previous step's output, as one argument) as its last argument."""
    if "message" in step:
        message = _piped(Message(**step["message"]), piped, ignore)
        broker.enqueue(message, delay=delay or message.options.get("delay"))
        return
    members = [_piped(Message(**data), piped, ignore) for data in step["group"]["members"]]
    broker.enqueue_many(members, delay=delay)  # type: ignore[attr-defined]  # a PostgresBroker's


class GroupSteps(Middleware):
    """After a step's run: a message whose next step is a group sends the group's members;
    a member stores its result and, last of its group, sends the next step; a member that
    failed for good marks its group failed (logged with the reason): the next step never runs.
    """

    placement: ClassVar[Placement] = Before(
        Retries, "a member failed for good is known only once Retries has run (message.failed)")
    # A job with none of the signal plan's keys (signals.PLAN_KEYS holds FANOUT and FANIN)
    # is no step around a group.
    inert_when_planned = frozenset({"after_process_message"})

    def __init__(self, backend: PostgresBackend, *, ttl: int = defaults.FANIN_TTL_MS) -> None:
        self.backend = backend
        self.ttl = ttl

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        fanout, fanin = message.options.get(FANOUT), message.options.get(FANIN)
        if not (fanout or fanin) or getattr(message, "fenced", None):
            return
        if exception is None and not message.failed:
            if fanout:
                actor = broker.get_actor(message.actor_name)
                send_step(broker, {"group": fanout}, piped=(result,), ignore=bool(actor.options.get("pipe_ignore")))
            if fanin:
                self._arrive(broker, message, fanin, result)
        elif message.failed and fanin:
            self.fail(message, fanin, f"{type(exception).__name__}: {exception}" if exception else "failed")

    def _arrive(self, broker: Broker, message: MessageProxy, fanin: dict[str, Any], result: Any) -> None:
        encoder = dramatiq.get_encoder()
        try:
            value = encoder.encode(result)
        except Exception as exc:  # the next step could not take it as an argument either
            self.fail(message, fanin, f"its result cannot be encoded: {type(exc).__name__}: {exc}")
            return
        params = {"id": fanin["id"], "size": fanin["size"], "member": fanin["index"], "value": value,
                  "ttl_ms": self.ttl}
        # Idempotent (a result per index, once): tried again while the database is unreachable.
        backoff.retry(lambda: self._store(broker, fanin, params), f"pipeline group {fanin['id']}'s member"
                      f" {fanin['index']}", first=0.2, give_up_after=defaults.ARRIVAL_RETRY_SECONDS,
                      retry_on=CONNECTION_ERRORS)

    def _store(self, broker: Broker, fanin: dict[str, Any], params: dict[str, Any]) -> None:
        encoder = dramatiq.get_encoder()
        with self.backend.pool.connection(timeout=10) as c, c.transaction():
            c.execute(sql.FANIN_OPEN, params)
            row = c.execute(sql.FANIN_ARRIVE, params).fetchone()
            if row is None:
                return  # this member's result is in already (it ran again)
            arrived, size, failed = row
            if failed is not None or arrived < size:
                return
            results = [encoder.decode(bytes(v)) for (v,) in c.execute(sql.FANIN_RESULTS, params)]
            then = fanin.get("then")
            if then:
                with broker.transaction(c):  # type: ignore[attr-defined]  # commits with the count, or not at all
                    send_step(broker, then, piped=(results,))

    def fail(self, message: MessageProxy | Message[Any], fanin: dict[str, Any], why: str) -> None:
        """Mark the member's group failed (its first reason kept): the rest never runs."""
        reason = f"member {fanin['index']} ({message.actor_name}, message {message.message_id}) failed for good: {why}"

        def store() -> None:
            with self.backend.pool.connection(timeout=10) as c:
                c.execute(sql.FANIN_FAIL, {"id": fanin["id"], "size": fanin["size"], "reason": reason,
                                           "ttl_ms": self.ttl})

        backoff.retry(store, f"pipeline group {fanin['id']}'s failure", first=0.2,
                      give_up_after=defaults.ARRIVAL_RETRY_SECONDS, retry_on=CONNECTION_ERRORS)
        log.warning("pipeline group %s: %s; the rest of the pipeline will not run", fanin["id"], reason)
