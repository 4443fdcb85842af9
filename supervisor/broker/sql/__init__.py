"""Every SQL statement on ``job_queue``, ``job_history``, ``job_concurrency``, ``job_events``,
``job_progress`` and ``queue_pauses``: the one place for these tables, in one module
per concern, all read as ``sql.NAME`` (the claim's and FINISH's takes from and blocks of
``rate_limiter_state`` too: flow.py, outcomes.py; its other statements are ratelimit.py's).

All statements take parameters; none is built from input. Live statuses are
'pending', 'retryable' and 'running'.
"""

from .claiming import (
    _CLAIMED,
    CLAIM,
    CLAIM_KEYED,
    CURSOR_COLUMN,
    KEYED_COLUMN,
    KEYS_COLUMN,
    NEXT_DUE,
    WAIT_COLUMN,
    claim,
)
from .enqueue import (
    BULK_COLUMNS,
    COPY_FLOW_JOBS,
    COPY_FLOW_JOBS_AT,
    COPY_JOBS,
    COPY_JOBS_AT,
    FLOW_COLUMNS,
    INSERT,
    INSERT_MANY,
    LIVE_BY_DEDUPE_KEYS,
    RUN_AT,
)
from .flow import BLOCK_JOB_KEY
from .history import (
    ADD_DAY,
    DAYS_AHEAD,
    DROP_DAYS,
    JOB_COLUMNS,
    PRUNE_ROWS,
    archive,
)
from .outcomes import (
    CANCEL,
    FINISH,
    HEARTBEAT,
    REAP_EXPIRED,
    RELEASE_DEAD,
    RELEASE_NODE,
    RELEASE_OWNER,
    RETRY_FAILED,
)
from .queues import (
    DEAD_LETTERS,
    FAILED_SINCE,
    FLUSH_QUEUE,
    LIVE_IN_QUEUE,
    NOW,
    PAUSE_QUEUE,
    PAUSED_QUEUES,
    PROGRESS,
    RESUME_QUEUE,
    WRITE_PROGRESS,
)
from .upkeep import (
    ANALYZE_JOBS,
    JOBS_STATS_STALE,
    JOBS_VACUUM_DUE,
    PRUNE_EVENTS,
    PRUNE_PROGRESS,
    VACUUM_JOBS,
)

__all__ = [
    "INSERT",
    "BULK_COLUMNS",
    "INSERT_MANY",
    "COPY_JOBS",
    "COPY_JOBS_AT",
    "COPY_FLOW_JOBS",
    "COPY_FLOW_JOBS_AT",
    "FLOW_COLUMNS",
    "RUN_AT",
    "LIVE_BY_DEDUPE_KEYS",
    "_CLAIMED",
    "CLAIM",
    "claim",
    "KEYED_COLUMN",
    "KEYS_COLUMN",
    "CLAIM_KEYED",
    "WAIT_COLUMN",
    "CURSOR_COLUMN",
    "NEXT_DUE",
    "HEARTBEAT",
    "RELEASE_OWNER",
    "RELEASE_DEAD",
    "RELEASE_NODE",
    "REAP_EXPIRED",
    "CANCEL",
    "FINISH",
    "BLOCK_JOB_KEY",
    "RETRY_FAILED",
    "ADD_DAY",
    "DAYS_AHEAD",
    "DROP_DAYS",
    "JOB_COLUMNS",
    "PRUNE_ROWS",
    "archive",
    "PRUNE_EVENTS",
    "PRUNE_PROGRESS",
    "JOBS_VACUUM_DUE",
    "JOBS_STATS_STALE",
    "ANALYZE_JOBS",
    "VACUUM_JOBS",
    "WRITE_PROGRESS",
    "PROGRESS",
    "PAUSE_QUEUE",
    "RESUME_QUEUE",
    "PAUSED_QUEUES",
    "FLUSH_QUEUE",
    "LIVE_IN_QUEUE",
    "FAILED_SINCE",
    "NOW",
    "DEAD_LETTERS",
]
