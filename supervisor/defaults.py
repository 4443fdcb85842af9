"""Every default of the runtime, defined once.

The config schema, the CLI options, the broker and the worker settings all
read these, so a default cannot drift between the places that use it.
"""

# Leases: a claim stays valid this long without a heartbeat; the heartbeat renews it.
LEASE_SECONDS = 30.0
HEARTBEAT_SECONDS = 10.0
# The `workers` role of a process that consumes a broker outside `supervisor worker` (the
# dramatiq CLI: broker/consuming/keeper.py registers and beats it).
DRAMATIQ_ROLE = "dramatiq"
# Self-fencing: a process stops a job it could not renew this long before the lease
# expires (a fraction of the lease, capped); other processes reclaim it only
# REAP_MARGIN_SECONDS after it expired. Together they keep two runs of a job apart.
FENCE_MARGIN_FRACTION = 0.2
FENCE_MARGIN_MAX = 5.0
REAP_MARGIN_SECONDS = 1.0
# The reaper skips the rows of a process whose beat is younger than this many of its beat
# intervals: it renewed all it holds just before (sql.REAP_EXPIRED). Past one interval, so
# a beat a little late is not read; a process frozen with beat >= 2/3 of its lease is then
# reaped up to 1.5 beats after its last rather than a lease after (a few seconds later).
REAP_FRESH_BEATS = 1.5
# A dead process is noticed by its beat: once its beat is this many of its beat intervals
# old and the server holds no session of it, other processes release its jobs; a process
# whose renewals have failed that long stops its jobs first (worker/liveness.py).
STALE_BEATS = 2.0
# The resource guard, on by default for memory: above this share of the host's memory
# a process stops claiming until it recovers. The CPU threshold is off unless set: a
# host busy with this supervisor's own jobs would back off from its own work (see
# ARCHITECTURE.md, "The resource guard").
GUARD_MEMORY_PERCENT = 85.0
# Poison pill: a job whose lease is lost this many times (it killed or stalled its
# process each time) ends failed. Lost leases never spend max_retries.
MAX_LEASE_LOSSES = 3
# Longest idle wait between claims when no NOTIFY arrives.
POLL_INTERVAL = 1.0
# Retries, in milliseconds like Dramatiq's own options.
MAX_RETRIES = 20
MIN_BACKOFF_MS = 15_000
MAX_BACKOFF_MS = 24 * 3600 * 1000  # the cap: a retry is never further away than a day
# How long a producer's send or enqueue_many keeps writing again on a fresh connection
# when the server ends its connection (or none comes), before BrokerConnectionError.
ENQUEUE_RETRY_SECONDS = 10.0
# A worker process.
THREADS = 8
# What runs its jobs (worker/process.py): supervisor's own executor (worker/executor.py),
# or dramatiq.Worker.
# The setting that chose a broker's storage until every job the log can take went there
# (one store): "table" kept every job in job_queue. Read only to say it is ignored now
# (logstore.ignored_storage; the config's database.storage likewise).
STORAGE_ENV = "SUPERVISOR_STORAGE"
# With the log, every this-many-th claim of a consumer asks job_queue first (the others ask
# it only when the log has nothing: broker.claim): its retries and delayed jobs wait at most
# that many claims under load.
LOG_TABLE_TURN = 8
# Dead tuples of the log's narrow tables (leases, cursors) at which the upkeep vacuums them.
LOG_VACUUM_DEAD_ROWS = 1000
# A concurrency slot's kept row (migration 046) goes once it has been free this long.
SLOT_KEEP_SECONDS = 60.0
EXECUTORS = ("own", "dramatiq")
EXECUTOR = "own"
# Coroutines of async actors one process runs at once (its own executor: on its event loop,
# holding no thread). Each holds a claimed row and a lease, and usually a socket: 100 is
# 12x the default threads (waits on I/O rarely need more per process), keeps a process's
# heartbeat (one UPDATE of every held id) small, and leaves a backlog to other processes
# rather than hoarding it in one; a role of many slow awaits raises it.
ASYNC_LIMIT = 100
# Prefetch when a role sets none (paced, broker/consuming/pace.py): up to PREFETCH_PER_THREAD x threads
# rows, as many beyond the threads as the threads free within PREFETCH_WAIT_SECONDS at the
# recent mean run time. Short jobs get the next claim overlapping the current batch; long
# ones are never hoarded while another process idles. 16, not 8 (nor 4): a claim and an
# ack batch each cost the worker ~150 us of Python whatever their size, and a no-op drain
# at 8 threads claims ~124 rows a claim, not ~62: 33,000 -> 40,000 jobs/s, worker CPU 22 ->
# 18 us and backends 30 -> 24 us a job (bench/README.md, third session of 2026-11-28; 4 -> 8
# gave 1.3-1.8x earlier); only jobs under 3 ms on average reach it, and the rows beyond the
# threads are still no more than the threads free within the wait. The wait is 50 ms, not 10: a process's 16
# threads of 50 ms jobs that hold 3 rows beyond them (10 ms) wait the claim's round trip
# for the rest whenever several end together, and W3 reached 88-94 % of ideal; with one
# row per thread beyond (50 ms) 95-96 % (bench/README.md, second session of 2026-11-28).
# A row held beyond the threads waits about the wait at most, and GiveBack hands it back
# to the queue when jobs turn out longer.
PREFETCH_PER_THREAD = 16
PREFETCH_WAIT_SECONDS = 0.05
# Rows waiting for a thread while every thread has been busy this long, none ending, go
# back to the queue for a process with a free thread (broker/consuming/pace.py GiveBack, which looks
# every half of it): with the claim that follows elsewhere, no row waits ~50 ms in one
# process while another has a thread free, at a switch to long jobs or on a slow host.
GIVE_BACK_SECONDS = 0.02
# A claimed batch wakes as many idle worker threads as it needs: its actors' mean run time
# over this slice (at least one), or every one it can use while any of its actors has not
# run here yet (broker/consuming/pace.py Pace.wakes). Waking a thread costs the claim thread a
# futex wake and the woken thread a GIL hand-off: waking all 8 for every batch of no-op
# jobs cost the worker ~4 us of CPU a job (26 -> 22 us, 28,500 -> 32,200 jobs/s, W1 2 x 8;
# bench/README.md, session of 2026-11-28, third). The threads that are awake take the
# rest as they end jobs; GiveBack wakes the others when no row was taken for its look.
WAKE_SLICE_SECONDS = 0.002


def capacity(threads: int, prefetch: int | None) -> int:
    """Rows a process may hold claimed at most: its prefetch, or when paced (None)
    PREFETCH_PER_THREAD x threads."""
    return prefetch or threads * PREFETCH_PER_THREAD

# Connections a supervisor worker process holds for the broker's own work (claims,
# acks, heartbeats, timers, sends): a fleet of many hosts must stay within what one
# PostgreSQL (or PgBouncer) can serve. Actor code's own queries use a separate pool.
WORKER_CONNECTIONS = 2
SHUTDOWN_TIMEOUT = 30.0
PRUNE_SECONDS = 300.0
# Retention (the config's `retention:` section): how long each kind of row is kept.
DAY = 24 * 3600.0
RETENTION = {"succeeded": 7 * DAY, "failed": 30 * DAY, "cancelled": 7 * DAY, "events": 30 * DAY,
             "runs": 30 * DAY, "results": 1 * DAY, "audit": 90 * DAY}
# Rows one prune statement deletes at most: short statements, short locks.
PRUNE_BATCH = 1000
# A prune runs at least this often per shortest retention (a 60 s retention is pruned
# every 15 s, not every PRUNE_SECONDS), but never more often than PRUNE_MIN_SECONDS.
PRUNE_PER_RETENTION = 4
PRUNE_MIN_SECONDS = 5.0
# The jobs table's own vacuum (worker upkeep): once this many dead tuples wait, one
# process (the vacuum's own lock, never waited on) vacuums jobs, so the claim index sheds the entries of
# claimed rows within seconds instead of at autovacuum's next visit (a minute).
VACUUM_DEAD_ROWS = 20_000
VACUUM_CHECK_SECONDS = 5.0
# ...but not again within this long of the last (auto)vacuum: each one reads every index.
VACUUM_MIN_SECONDS = 10.0
# At the same checks: ANALYZE jobs once it holds this many rows and the planner believes
# in under a quarter of them (see sql.JOBS_STATS_STALE).
STATS_MIN_ROWS = 1000
# The supervisor (master).
TICK = 0.5
KILL_GRACE = 5.0
START_TIMEOUT = 60.0
RESTART_BACKOFF = 0.5
RESTART_BACKOFF_MAX = 30.0
MASTER_BEAT_SECONDS = 10.0
# Schedules.
SCHEDULE_LOCK_TTL = 300.0
# A fire later than this (the process was stopped, suspended, or the database away) is
# missed: what becomes of it is the schedule's catch_up.
SCHEDULE_GRACE = 60.0
# The most missed fires one catch-up of `catch_up: all` runs (the latest ones).
SCHEDULE_CATCH_UP_LIMIT = 100
# The zone of schedules that name none (supervisor.timezone): UTC, as before zones existed.
SCHEDULE_TIMEZONE = "UTC"
# The HTTP child (`http:`): loopback unless told otherwise.
HTTP_HOST = "127.0.0.1"
HTTP_PORT = 9191
# prometheus_client's multiprocess directory: set by the master for its children.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

# How long a group step of supervisor.pipeline keeps its fan-in (the members' results and
# count, broker/fanin.py) for its slowest member: then the upkeep's prune deletes it.
FANIN_TTL_MS = 7 * 86400 * 1000
# How long a group member's arrival (its count, its result) is tried again when the database
# is unreachable: idempotent, so a retry after a commit whose answer was lost changes nothing;
# given up, the member's run ends without it and its group waits (logged).
ARRIVAL_RETRY_SECONDS = 30.0
