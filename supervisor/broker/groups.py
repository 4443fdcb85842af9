"""GroupCallbacks: Dramatiq's middleware for group completion callbacks, each member
counted once.

``dramatiq.group(...).add_completion_callback(m).run()`` finds it (a subclass of
Dramatiq's, so ``group.run`` does) and makes its barrier with ``Barrier.create``
on the broker's rate-limiter backend (limiter.PostgresBackend), as with Redis. What
differs is the arrival: Dramatiq's decrements the barrier after each member's run, so a
member run again (its process killed after that decrement, before its ack) counts twice,
and the callbacks may go out before every member ran, or twice. Here a member arrives by
its message id (``group_arrivals``), and the member that counts last sends the callbacks
in the arrival's transaction: once, after every member, whatever is killed when.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq.middleware.group_callbacks
import psycopg
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message

from .limiter import PostgresBackend

log = logging.getLogger(__name__)

class GroupCallbacks(dramatiq.middleware.group_callbacks.GroupCallbacks):
    """Dramatiq's GroupCallbacks (the same constructor), arrivals counted once per member
    on a PostgresBackend; on any other backend, Dramatiq's own behaviour."""

    # A job whose options carry none of the signal plan's keys (signals.PLAN_KEYS, which
    # hold GROUP_MEMBER_OPTIONS) is no group member: nothing to do.
    inert_when_planned = frozenset({"after_process_message"})

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        backend = self.rate_limiter_backend
        if not isinstance(backend, PostgresBackend):
            super().after_process_message(  # type: ignore[no-untyped-call]  # dramatiq's, unannotated
                broker, message, result=result, exception=exception)
            return
        barrier = message.options.get("group_completion_uuid")
        callbacks = message.options.get("group_completion_callbacks")
        if exception is not None or getattr(message, "fenced", None) or not (barrier and callbacks):
            return

        def send_callbacks(conn: psycopg.Connection) -> None:
            # Written through the arrival's connection: they commit with it, or not at all.
            with broker.transaction(conn):  # type: ignore[attr-defined]  # a PostgresBroker's
                for data in callbacks:
                    broker.enqueue(Message(**data))

        if backend.arrive(barrier, message.message_id, self.barrier_ttl, send_callbacks) is None:
            log.debug("group member %s: counted already, or its barrier %s expired", message.message_id, barrier)
