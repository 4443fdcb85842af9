"""The fleet-wide LLM semaphore: N transaction advisory locks ``(hashtext(key), slot)``.

A slot is held by a transaction that stays open while the model is asked, and
goes with it: COMMIT, ROLLBACK, or the connection closing when its process is
killed. Transaction-level, not session-level, so PgBouncer's transaction pooling
cannot strand it: a session lock taken and released by separate statements may
land on two server connections, and the one that took it keeps it for good."""

TRY_SLOT = "SELECT pg_try_advisory_xact_lock(hashtext(%(key)s), %(slot)s)"

# How many slots are held right now, by anyone (for tests and the operator).
HELD = """
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND classid::int = hashtext(%(key)s) AND objsubid = 2
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
