"""A job's states and the moves between them: the one definition the code, the docs
(docs/job-states.md, whose diagram a test reads back) and the tests share.

A job's state is what the jobs view says of it: a row of ``job_queue`` carries it in
``status`` (pending, waiting, running, retryable), a row of ``job_history`` its end
(succeeded, failed, cancelled); a job of the log is pending until claimed, running while a
lease holds it, and its newest attempt's ``job_done`` row says how that attempt ended
(``Outcome``); a row of ``job_timers`` (a delayed job, a log job's retry, a keyed log job
waiting for its reserved start or its key's block) is pending, retryable or waiting until
its run_at, when a claim moves it into the log, pending. Every move that matters is written to ``job_events`` (from, to): a test
checks each one written by the suite against ``TRANSITIONS``.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """A job's state, in a job's order (the jobs view's ``status``)."""

    PENDING = "pending"  # ready now or at its run_at: a claim may take it
    WAITING = "waiting"  # held back by its limit key (flow control) until the key has room
    RUNNING = "running"  # claimed: a lease renewed by its owner's beat holds it
    RETRYABLE = "retryable"  # failed an attempt, due again at its backoff's run_at
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # out of attempts (or of its lease-loss budget): an operator may retry it
    CANCELLED = "cancelled"


class Outcome(StrEnum):
    """How one attempt of a job of the log ended (``job_done.status``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RETRIED = "retried"  # the job goes on in job_timers (051), retryable at its backoff (or job_queue: an edit)
    REQUEUED = "requeued"  # claimed, never started: appended to the log again (or put back by a limit)
    RELEASED = "released"  # its owner died or its lease ran out: appended to the log again


# A new job's state: pending, or waiting when it carries a limit key.
SENT: frozenset[JobState] = frozenset({JobState.PENDING, JobState.WAITING})

# Where a job stops unless an operator moves it again.
ENDED: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# from -> {to: what moves it}. Nothing else moves a job.
TRANSITIONS: dict[JobState, dict[JobState, str]] = {
    JobState.PENDING: {
        JobState.RUNNING: "claim",
        JobState.WAITING: "a claim parks a log job whose concurrency key is full, or to wait for its fairness key's turn, or reserves its rate's later start",
        JobState.CANCELLED: "cancel",
    },
    JobState.WAITING: {
        JobState.RUNNING: "claim, once its key has room",
        JobState.PENDING: "a job of its key ends and hands it its slot, its key's turn comes, or its reserved start comes (log)",
        JobState.CANCELLED: "cancel",
    },
    JobState.RETRYABLE: {
        JobState.RUNNING: "claim",
        JobState.PENDING: "due: a claim promotes it from job_timers into the log",
        JobState.CANCELLED: "cancel",
    },
    JobState.RUNNING: {
        JobState.SUCCEEDED: "ack",
        JobState.FAILED: "fail (out of attempts, or of lease losses)",
        JobState.RETRYABLE: "retry",
        JobState.PENDING: "requeue, release, or a limit's put-back",
        JobState.WAITING: "a late limit key; a retry, release or put-back of a job with a key",
        JobState.CANCELLED: "cancel",
    },
    JobState.FAILED: {JobState.PENDING: "an operator's retry", JobState.WAITING: "an operator's retry (a key)"},
    JobState.CANCELLED: {JobState.PENDING: "an operator's retry", JobState.WAITING: "an operator's retry (a key)"},
    JobState.SUCCEEDED: {},
}


def allowed(before: str | None, after: str) -> bool:
    """Whether a job may move from ``before`` (None: it is being sent) to ``after``."""
    try:
        to = JobState(after)
        if before is None:
            return to in SENT
        return to in TRANSITIONS[JobState(before)]
    except ValueError:  # not a state at all
        return False
