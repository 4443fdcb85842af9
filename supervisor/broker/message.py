"""A claimed row as a Dramatiq message, and the encodings both directions share."""

from __future__ import annotations

import json
import traceback
from typing import Any

from dramatiq.broker import MessageProxy
from dramatiq.encoder import JSONEncoder
from dramatiq.errors import ActorNotFound
from dramatiq.message import Message, get_encoder
from psycopg.types.json import Jsonb


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def jsonb(value: Any) -> Jsonb:
    """A value for a jsonb parameter, compact (the rows stay small)."""
    return Jsonb(value, dumps=_dumps)


def body_columns(message: Message | MessageProxy) -> dict[str, Any]:
    """The args, kwargs, options and payload columns of a message.

    With Dramatiq's JSONEncoder (the default) the message is readable jsonb and
    there is no payload. Any other encoder (Pickle, a user's own) is honoured:
    the payload holds exactly what it encodes, and the jsonb columns stay empty.
    """
    if type(get_encoder()) is JSONEncoder:
        return {"args": jsonb(list(message.args)), "kwargs": jsonb(message.kwargs),
                "options": jsonb(message.options), "payload": None}
    return {"args": jsonb([]), "kwargs": jsonb({}), "options": jsonb({}), "payload": message.encode()}


def _fields(body: str, payload: bytes | None) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    if payload is None:
        args, kwargs, options = json.loads(body)
        return args, kwargs, options
    data = get_encoder().decode(bytes(payload))
    return data["args"], data["kwargs"], data["options"]


class PgMessageProxy(MessageProxy):
    """A claimed row: the message plus the lease fence (attempt number)."""

    def __init__(self, message: Message, *, attempts: int, max_attempts: int, concurrency_key: str | None):
        super().__init__(message)
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.concurrency_key = concurrency_key


def from_claimed_row(row: tuple[Any, ...]) -> PgMessageProxy:
    """Build the message of one row of ``sql.CLAIM``."""
    job_id, queue, actor, body, attempts, max_attempts, ckey, timestamp_ms, payload = row
    args, kwargs, options = _fields(body, payload)
    message: Message[Any] = Message(
        queue_name=queue,
        actor_name=actor,
        args=tuple(args),
        kwargs=kwargs,
        options=options,
        message_id=job_id,
        message_timestamp=int(timestamp_ms),
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
