"""A claimed row as a Dramatiq message, and the encodings both directions share."""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable, Container
from typing import Any

from dramatiq.broker import MessageProxy
from dramatiq.encoder import JSONEncoder
from dramatiq.errors import ActorNotFound
from dramatiq.message import Message, get_encoder
from psycopg.types.json import Jsonb

from ..flow import KEY_ERROR

# Compact JSON (the rows stay small); one encoder for all, not one per call.
_dumps = json.JSONEncoder(separators=(",", ":")).encode
# A claimed row's body is the server's compact JSON text: its scanner is called at once
# (json.loads goes through three Python frames and two whitespace matches first: 0.8
# against 0.14 us for an empty body).
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by its __init__, not in the stubs


def jsonb(value: Any) -> Jsonb:
    """A value for a jsonb parameter, compact."""
    return Jsonb(value, dumps=_dumps)


def readable_body() -> bool:
    """Whether messages are stored as readable jsonb (Dramatiq's JSONEncoder, the
    default) rather than as the payload another encoder (Pickle, a user's own) makes."""
    return type(get_encoder()) is JSONEncoder


def body_columns(message: Message[Any] | MessageProxy) -> dict[str, Any]:
    """The args, kwargs, options and payload columns of a message.

    With Dramatiq's JSONEncoder (the default) the message is readable jsonb and
    there is no payload. Any other encoder (Pickle, a user's own) is honoured:
    the payload holds exactly what it encodes, and the jsonb columns stay empty.
    """
    if readable_body():
        return {"args": jsonb(list(message.args)), "kwargs": jsonb(message.kwargs),
                "options": jsonb(message.options), "payload": None}
    return {"args": jsonb([]), "kwargs": jsonb({}), "options": jsonb({}), "payload": message.encode()}


def body_text(message: Message[Any], readable: bool) -> tuple[str, str, str, bytes | None]:
    """``body_columns`` as JSON text, for the bulk path (``readable``: ``readable_body()``,
    asked once per batch). Empty args, kwargs and options, the common case, cost
    no encoding."""
    if not readable:
        return "[]", "{}", "{}", message.encode()
    args, kwargs, options = message.args, message.kwargs, message.options
    return ("[]" if args == () else _dumps(list(args)), "{}" if kwargs == {} else _dumps(kwargs),
            "{}" if options == {} else _dumps(options), None)


def _fields(body: str, payload: bytes | None) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    if payload is None:
        try:
            (args, kwargs, options), end = _scan(body, 0)
        except StopIteration:
            raise json.JSONDecodeError("Expecting value", body, 0) from None
        if end != len(body):
            raise json.JSONDecodeError("Extra data", body, end)
        return args, kwargs, options
    data = get_encoder().decode(bytes(payload))
    return data["args"], data["kwargs"], data["options"]


class PgMessageProxy(MessageProxy):
    """A claimed row: the message plus the lease fence (attempt number).

    ``deliveries`` excludes deliveries that ended in a lost lease: it is what the
    exception budget (``max_attempts``, max_retries + 1) is spent against.
    ``fenced`` says why this process must not write an outcome for it any more
    (its lease was lost or the job was cancelled while it ran).
    """

    def __init__(self, message: Message[Any], *, attempts: int, max_attempts: int,
                 concurrency_key: str | None, lease_losses: int = 0):
        super().__init__(message)
        # The fields middleware and the worker read a dozen times per job, as plain
        # attributes: MessageProxy would find each through __getattr__, after a
        # failed lookup (about a microsecond each). The message is frozen and
        # options is the same dict, so nothing can drift apart.
        self.message_id = message.message_id
        self.queue_name = message.queue_name
        self.actor_name = message.actor_name
        self.args = message.args
        self.kwargs = message.kwargs
        self.options = message.options
        self.message_timestamp = message.message_timestamp
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.concurrency_key = concurrency_key
        self.lease_losses = lease_losses
        self.fenced: str | None = None
        self.retried = False  # the Retries middleware scheduled another delivery
        # When this attempt began and stopped running in its thread (time.monotonic(),
        # set by the Fence): the outcome write turns them into started_at / finished_at,
        # so a duration is the attempt's run time, not its wait in a prefetch buffer.
        self.started: float | None = None
        self.ended: float | None = None
        # An async actor's job runs on the event loop, not in a thread of its own: how to
        # stop it (the Fence calls it with the Interrupt, where it would raise one in a
        # thread); None for a job that runs in a thread.
        self.interrupt: Callable[[type[BaseException]], None] | None = None
        # Where a job claimed from the log lives there (logstore.LogRow), None for a
        # job_queue row: its outcome goes to sql.LOG_FINISH instead of sql.FINISH.
        self.log_row: Any = None
        # A result stored for a job of the log (results.py), as jobs.result shows it: written
        # onto its done row with its outcome (job_queue's row gets it from the store itself).
        self.log_result: Any = None
        # The trace and span ids of the span this attempt ran in (supervisor/tracing.py),
        # for the job's log line, which is written off the job's thread.
        self.trace_ids: dict[str, str] | None = None

    @property
    def deliveries(self) -> int:
        return self.attempts - self.lease_losses


class Unreadable(ValueError):
    """A claimed row that cannot become a message; the text names the column and
    the value's type. The row fails alone; the rows claimed with it run."""


# Options the middleware reads as numbers, with the smallest value that makes sense.
_NUMERIC_OPTIONS = {"max_retries": 0, "max_attempts": 1, "max_lease_losses": 1, "min_backoff": 0,
                    "max_backoff": 0, "time_limit": 0, "max_age": 0, "eta": 0}
_JSON_TYPES = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
               (list, "an array"), (dict, "an object"))


def json_type(value: Any) -> str:
    """The JSON type of a decoded value, for error messages."""
    if value is None:
        return "null"
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), type(value).__name__)


def _check(row: tuple[Any, ...], args: Any, kwargs: Any, options: Any, actors: Container[str]) -> None:
    actor = row[2]
    if not isinstance(args, list | tuple):  # a tuple: decoded by a non-JSON encoder
        raise Unreadable(f"args must be a JSON array, got {json_type(args)}")
    if not isinstance(kwargs, dict):
        raise Unreadable(f"kwargs must be a JSON object, got {json_type(kwargs)}")
    if not isinstance(options, dict):
        raise Unreadable(f"options must be a JSON object, got {json_type(options)}")
    if actor not in actors:
        raise Unreadable(unknown_actor_text(actor))
    if options and KEY_ERROR in options:  # the producer could not make its limit key (flow.py)
        raise Unreadable(f"its limit key could not be made at send: {options[KEY_ERROR]}")
    for name, low in _NUMERIC_OPTIONS.items() if options else ():
        value = options.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < low:
            raise Unreadable(f"options.{name} must be a number >= {low}, got {json_type(value)} {value!r:.60}")


def _message(queue: str, actor: str, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any],
             message_id: str, timestamp: int) -> Message[Any]:
    """``Message(...)`` with its fields written straight into the instance: the frozen
    dataclass's own __init__ sets each through object.__setattr__ and runs __post_init__
    (which only makes args a tuple, as it is here): 1.05 us a claimed row, against 0.25.
    The same object either way (tests/test_signals.py compares them)."""
    message: Message[Any] = object.__new__(Message)
    fields = message.__dict__
    fields["queue_name"] = queue
    fields["actor_name"] = actor
    fields["args"] = args
    fields["kwargs"] = kwargs
    fields["options"] = options
    fields["message_id"] = message_id
    fields["message_timestamp"] = timestamp
    return message


def from_claimed_row(row: tuple[Any, ...], actors: Container[str]) -> PgMessageProxy:
    """Build the message of one row of ``sql.CLAIM``; raise Unreadable if it cannot be one."""
    job_id, queue, actor, body, attempts, max_attempts, ckey, losses, timestamp_ms, payload = row[:10]
    try:
        args, kwargs, options = _fields(body, payload)
    except Exception as exc:  # a payload written by another encoder, or a corrupt one
        raise Unreadable(f"payload cannot be decoded by {type(get_encoder()).__name__}: {exc}") from None
    _check(row, args, kwargs, options, actors)
    # The row's run_at schedules it. Dramatiq would hold a message with an `eta` in
    # memory and re-send it under the same id, which the row (already there) absorbs.
    options.pop("eta", None)
    message = _message(queue, actor, tuple(args), kwargs, options, job_id, int(timestamp_ms))
    return PgMessageProxy(message, attempts=attempts, max_attempts=max_attempts, concurrency_key=ckey,
                          lease_losses=losses)


def decode_claimed(rows: list[tuple[Any, ...]], actors: Container[str]
                   ) -> tuple[list[PgMessageProxy], list[tuple[str, int, str]]]:
    """The messages of claimed rows, and (id, attempt, why) of rows that cannot be one."""
    out, bad = [], []
    for row in rows:
        try:
            out.append(from_claimed_row(row, actors))
        except (Unreadable, ValueError, TypeError) as exc:
            bad.append((str(row[0]), int(row[4]), f"cannot become a message: {exc}"))
    return out, bad


def unknown_actor_text(name: object) -> str:
    return (
        f"actor: no actor named {name} is declared in this worker. "
        "Add its module to the role's actors (or fix the actor name in the job row)."
    )


def error_text(exception: BaseException | None) -> str:
    """What `jobs.last_error` keeps: the traceback's tail, or advice for a missing actor."""
    if exception is None:
        return "failed without an exception"
    if isinstance(exception, ActorNotFound):
        return f"ActorNotFound: {unknown_actor_text(exception)}"
    text = "".join(traceback.format_exception(exception))
    return text[-8000:]
