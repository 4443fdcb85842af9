"""Every default of the runtime, defined once.

The config schema, the CLI options, the broker and the worker settings all
read these, so a default cannot drift between the places that use it.
"""

# Leases: a claim stays valid this long without a heartbeat; the heartbeat renews it.
LEASE_SECONDS = 30.0
HEARTBEAT_SECONDS = 10.0
# Longest idle wait between claims when no NOTIFY arrives.
POLL_INTERVAL = 1.0
# Retries, in milliseconds like Dramatiq's own options.
MAX_RETRIES = 20
MIN_BACKOFF_MS = 15_000
MAX_BACKOFF_MS = 24 * 3600 * 1000  # the cap: a retry is never further away than a day
# A worker process.
THREADS = 8
SHUTDOWN_TIMEOUT = 30.0
RETENTION_SECONDS = 7 * 24 * 3600.0
PRUNE_SECONDS = 300.0
# The supervisor (master).
TICK = 0.5
KILL_GRACE = 5.0
START_TIMEOUT = 60.0
RESTART_BACKOFF = 0.5
RESTART_BACKOFF_MAX = 30.0
MASTER_BEAT_SECONDS = 10.0
# Schedules.
SCHEDULE_LOCK_TTL = 300.0
# The HTTP child (`http:`): loopback unless told otherwise.
HTTP_HOST = "127.0.0.1"
HTTP_PORT = 9191
# prometheus_client's multiprocess directory: set by the master for its children.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
