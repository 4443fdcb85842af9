"""The broker's middleware: Retries counted by the job row, and the job options.

Retries use deterministic exponential backoff.

Dramatiq's own Retries counts retries in the message options and adds jitter.
Here (a subclass of it, so code that looks for Dramatiq's Retries finds it) the
row is the count: ``attempts`` (every claim) minus ``lease_losses`` (claims that
ended with the process dead, frozen or cut off), so, as in Dramatiq,
``max_retries`` counts exceptions only. A job that keeps killing its process is
stopped by its own budget, ``max_lease_losses`` (see sql/outcomes.py).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import dramatiq
from dramatiq.actor import Actor
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from .. import db, defaults, flow

# The message options a group member carries from Dramatiq's group.run() (read by
# groups.GroupCallbacks), and those supervisor.pipeline gives a step that fans out to a
# group and each member of that group (fanin.GroupSteps): the signal plan keeps those
# middleware's hooks only for a message that has one (signals.PLAN_KEYS).
GROUP_MEMBER_OPTIONS = frozenset({"group_completion_uuid", "group_completion_callbacks"})
FANOUT = "pipe_fanout"
FANIN = "pipe_fanin"
# A workflow step's message carries its workflow's id (supervisor/workflows.py): the signal
# plan keeps WorkflowSteps' hook for it (consuming/workflow_results.py), and job_history's end
# triggers of migration 049 fire only for a row with it.
WORKFLOW = "workflow"


class JobOptions(Middleware):
    """Declares the broker's own options so actors may set them as defaults (the flow
    control's are checked when an actor is declared: PostgresBroker.declare_actor)."""

    @property
    def actor_options(self) -> set[str]:
        return {"dedupe_key", "max_attempts", "max_lease_losses", *flow.OPTIONS}


def backoff_ms(attempt: int, base_ms: int, cap_ms: int) -> int:
    """Delay before retry number ``attempt`` (1-based): base * 2^(attempt-1), capped."""
    return int(min(cap_ms, base_ms * (2 ** max(0, attempt - 1))))


class Retries(dramatiq.middleware.Retries):
    """Dramatiq's Retries with the row's attempt count and deterministic backoff.

    What a user sees is Dramatiq's: the same actor options, ``options["retries"]``,
    ``["traceback"]`` and ``["requeue_timestamp"]``, ``Retry(delay=...)``, the
    ``on_retry_exhausted`` message and the same log lines on the same logger
    (``dramatiq.middleware.retries.Retries``).
    """

    def __init__(
        self,
        *,
        max_retries: int = defaults.MAX_RETRIES,
        min_backoff: int = defaults.MIN_BACKOFF_MS,
        max_backoff: int = defaults.MAX_BACKOFF_MS,
        retry_when: Any = None,
    ) -> None:
        super().__init__(max_retries=max_retries, retry_when=retry_when)
        # Dramatiq's constructor turns a 0 backoff into its default; ours is taken as given.
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff

    def _option(self, message: Message[Any] | MessageProxy, actor: Actor[..., Any], name: str,
                default: Any) -> Any:
        value = message.options.get(name)
        if value is None:
            value = actor.options.get(name)
        return default if value is None else value

    def max_attempts_for(self, message: Message[Any] | MessageProxy, actor: Actor[..., Any]) -> int:
        """The attempt budget written into a new row."""
        return int(self._option(message, actor, "max_retries", self.max_retries)) + 1

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if exception is None or getattr(message, "fenced", None):
            return  # a fenced job is neither retried nor failed here: its process lost it
        limited = getattr(broker, "limited", None)
        if isinstance(exception, flow.RateLimited) and limited is not None:
            self.logger.info("Message %r rate limited upstream: waits %gs.", message.message_id,
                             exception.retry_after)
            limited(message, exception.retry_after)
            return
        actor = broker.get_actor(message.actor_name)
        throws = message.options.get("throws") or actor.options.get("throws")
        if throws and isinstance(exception, throws):
            self.logger.info("Aborting message %r.", message.message_id)
            message.fail()
            return

        attempt = getattr(message, "deliveries", None) or message.options.get("retries", 0) + 1
        max_attempts = getattr(message, "max_attempts", None) or self.max_attempts_for(message, actor)
        message.options["retries"] = attempt
        message.options["traceback"] = traceback.format_exc(limit=30)
        message.options["requeue_timestamp"] = int(time.time() * 1000)
        retry_when = actor.options.get("retry_when", self.retry_when)
        if retry_when is not None:
            exhausted = not retry_when(attempt - 1, exception)
        else:
            exhausted = attempt >= max_attempts
        if exhausted:
            self.logger.warning("Retries exceeded for message %r.", message.message_id)
            message.fail()
            target = message.options.get("on_retry_exhausted") or actor.options.get("on_retry_exhausted")
            if target:
                broker.get_actor(target).send(
                    message.asdict(), {"retries": attempt - 1, "max_retries": max_attempts - 1}
                )
            return

        if isinstance(exception, dramatiq.Retry) and exception.delay is not None:
            delay = exception.delay
        else:
            base = self._option(message, actor, "min_backoff", self.min_backoff)
            cap = min(self._option(message, actor, "max_backoff", self.max_backoff), defaults.MAX_BACKOFF_MS)
            delay = backoff_ms(attempt, base, cap)
        self.logger.info("Retrying message %r in %d milliseconds.", message.message_id, delay)
        # The proxy goes back as it came, as in Dramatiq's Retries (PostgresBroker.enqueue
        # hands it to Outcomes.retry, which retries it in place); dramatiq types enqueue for a Message only.
        broker.enqueue(message, delay=delay)  # type: ignore[arg-type]


def actor_attempts(actors: dict[str, Any], retries: Retries | None) -> dict[str, int]:
    """Each actor's exception budget (max_attempts, or max_retries + 1), for rows that carry
    none: job_queue's claim (claim_budgets) and the log's (logstore.decode)."""
    out = {}
    for name, actor in actors.items():
        options = actor.options
        own = options.get("max_attempts")
        if own is None and retries is not None:
            retry_count = options.get("max_retries")
            own = (retries.max_retries if retry_count is None else int(retry_count)) + 1
        out[name] = 1 if own is None else int(own)
    return out


def row_budget(options: dict[str, Any], actor: int | None, default: int) -> int:
    """A claimed row's exception budget when it carries none, in job_queue's claim's order
    (sql.CLAIM's coalesce of jobs_option_int): the message's max_attempts, else its
    max_retries + 1, else its actor's (``actor``: actor_attempts'), else ``default``; an
    option that is no number in range is passed over, as there. The log's claim
    (logstore.decode) applies it to a row written by one who did not know the actor."""
    for name, low, plus in (("max_attempts", 1, 0), ("max_retries", 0, 1)):
        value = options.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= 1_000_000:
            return int(value) + plus
    return default if actor is None else actor


def claim_budgets(actors: dict[str, Any], retries: Retries | None) -> dict[str, Any]:
    """The claim's parameters for rows that carry no budgets (plain SQL inserts):
    each actor's exception budget (max_attempts, or max_retries + 1) and lease-loss
    budget, and the defaults for actors this process does not know; ``by_actor``, the
    exception budgets as a dict (not a claim's parameter: the log's decode reads it)."""
    names = list(actors)
    attempts = actor_attempts(actors, retries)
    losses = [actors[name].options.get("max_lease_losses") for name in names]
    # As array literals: computed once, sent with every claim (see db.array_text).
    return {"actors": db.array_text(names), "actor_max_attempts": db.array_text([attempts[n] for n in names]),
            "actor_max_losses": db.array_text(losses),
            "default_max_attempts": 1 if retries is None else retries.max_retries + 1,
            "default_max_losses": defaults.MAX_LEASE_LOSSES, "by_actor": attempts}

