"""A claimed row as a Dramatiq message, and the encodings both directions share."""

from __future__ import annotations

import json
import traceback
from typing import Any

from dramatiq.broker import MessageProxy
from dramatiq.errors import ActorNotFound
from dramatiq.message import Message
from psycopg.types.json import Jsonb


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def jsonb(value: Any) -> Jsonb:
    """A value for a jsonb parameter, compact (the rows stay small)."""
    return Jsonb(value, dumps=_dumps)


class PgMessageProxy(MessageProxy):
    """A claimed row: the message plus the lease fence (attempt number)."""

    def __init__(self, message: Message, *, attempts: int, max_attempts: int, concurrency_key: str | None):
        super().__init__(message)
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.concurrency_key = concurrency_key


def from_claimed_row(row: tuple[Any, ...]) -> PgMessageProxy:
    """Build the message of one row of ``sql.CLAIM``."""
    job_id, queue, actor, body, attempts, max_attempts, ckey, created_ms = row
    args, kwargs, options = json.loads(body)
    message: Message[Any] = Message(
        queue_name=queue,
        actor_name=actor,
        args=tuple(args),
        kwargs=kwargs,
        options=options,
        message_id=job_id,
        message_timestamp=int(created_ms),
    )
    return PgMessageProxy(message, attempts=attempts, max_attempts=max_attempts, concurrency_key=ckey)


def error_text(exception: BaseException | None) -> str:
    """What `jobs.last_error` keeps: the traceback's tail, or advice for a missing actor."""
    if exception is None:
        return "failed without an exception"
    if isinstance(exception, ActorNotFound):
        return (
            f"ActorNotFound: no actor named {exception} is declared in this worker. "
            "Add its module to the role's actors (or fix the actor name in the job row)."
        )
    text = "".join(traceback.format_exception(exception))
    return text[-8000:]
