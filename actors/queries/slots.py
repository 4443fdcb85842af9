"""The fleet-wide LLM semaphore: N session advisory locks ``(hashtext(key), slot)``.

A session lock lives as long as the connection that took it: a killed process's
connection closes and the server frees its slot, so no slot can leak."""

TRY_SLOT = "SELECT pg_try_advisory_lock(hashtext(%(key)s), %(slot)s)"

RELEASE_SLOT = "SELECT pg_advisory_unlock(hashtext(%(key)s), %(slot)s)"

# How many slots are held right now, by anyone (for tests and the operator).
HELD = """
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND classid::int = hashtext(%(key)s) AND objsubid = 2
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
