"""Every statement on ``limiter_keys``, ``group_arrivals``, ``pipeline_fanins`` and
``pipeline_fanin_results`` (migration 047): Dramatiq's rate-limiter backend
(broker/limiter.py), the group completion barrier (broker/groups.py) and the fan-in of
a group in a pipeline (broker/fanin.py). All take parameters; ttl_ms is milliseconds.
A member ended by SQL alone (a poison pill's release, a cancel, a flush) fails its fan-in
through migration 048's function pipeline_member_ended, FANIN_FAIL's counterpart there.
"""

from __future__ import annotations

# Where wait_notify wakes the waiters of a key; the payload is the key's md5 (a key may be
# longer than a NOTIFY payload may).
CHANNEL = "actor_supervisor_limiter"

# A key's value as Dramatiq's backends see it: a row past its TTL counts as absent (0).
_LIVE = "(CASE WHEN k.expires_at > now() THEN k.value ELSE 0 END)"
_EXPIRES = "now() + %(ttl_ms)s * interval '1 millisecond'"

# add: a key that is absent, or expired (then replaced), takes the value.
ADD = f"""
INSERT INTO limiter_keys AS k (key, value, expires_at) VALUES (%(key)s, %(value)s, {_EXPIRES})
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
 WHERE k.expires_at <= now()
RETURNING true
"""

# incr / decr: one statement, atomic under concurrent callers (the row lock ON CONFLICT
# takes). The INSERT branch is used only when ``amount`` alone is within the bound
# (checked by the caller, so an absent key is 0 + amount); otherwise only an existing
# row can move (STEP_EXISTING), as an absent key would go out of bounds.
INCR = f"""
INSERT INTO limiter_keys AS k (key, value, expires_at) VALUES (%(key)s, %(amount)s, {_EXPIRES})
ON CONFLICT (key) DO UPDATE SET value = {_LIVE} + %(amount)s, expires_at = EXCLUDED.expires_at
 WHERE {_LIVE} + %(amount)s <= %(maximum)s
RETURNING true
"""

DECR = f"""
INSERT INTO limiter_keys AS k (key, value, expires_at) VALUES (%(key)s, -%(amount)s, {_EXPIRES})
ON CONFLICT (key) DO UPDATE SET value = {_LIVE} - %(amount)s, expires_at = EXCLUDED.expires_at
 WHERE {_LIVE} - %(amount)s >= %(minimum)s
RETURNING true
"""

# Add ``delta`` (negative for decr) to an existing row within [minimum, maximum].
STEP_EXISTING = f"""
UPDATE limiter_keys AS k SET value = {_LIVE} + %(delta)s, expires_at = {_EXPIRES}
 WHERE k.key = %(key)s AND {_LIVE} + %(delta)s BETWEEN %(minimum)s AND %(maximum)s
RETURNING true
"""

# incr_and_sum, first: the key's row exists, so the next statement can lock it.
ENSURE = f"""
INSERT INTO limiter_keys AS k (key, value, expires_at) VALUES (%(key)s, 0, {_EXPIRES})
ON CONFLICT (key) DO NOTHING
"""

# Then: every key summed and the key itself locked in key order (two windows that overlap
# lock their common buckets in the same order, so they queue rather than deadlock), read
# as locked (READ COMMITTED re-reads a row it waited for), and the key incremented only if
# both it and the sum stay within the maximum (as Dramatiq's Redis backend checks).
INCR_AND_SUM = f"""
WITH locked AS (
    SELECT k.key, {_LIVE} AS value FROM limiter_keys k
     WHERE k.key = ANY(%(keys)s) OR k.key = %(key)s
     ORDER BY k.key FOR UPDATE
), totals AS (
    SELECT coalesce(sum(value) FILTER (WHERE key = %(key)s), 0) AS own,
           coalesce(sum(value) FILTER (WHERE key = ANY(%(keys)s)), 0) AS in_window
      FROM locked
)
UPDATE limiter_keys k SET value = t.own + %(amount)s, expires_at = {_EXPIRES}
  FROM totals t
 WHERE k.key = %(key)s AND t.own + %(amount)s <= %(maximum)s AND t.in_window + %(amount)s <= %(maximum)s
RETURNING true
"""

# wait_notify: the event is kept for ttl (a wait that starts later still sees it, as with
# Redis), and every waiter of the key is woken.
NOTIFY_EVENT = f"""
WITH stored AS (
    INSERT INTO limiter_keys AS k (key, value, expires_at) VALUES (%(key)s, 1, {_EXPIRES})
    ON CONFLICT (key) DO UPDATE SET value = {_LIVE} + 1, expires_at = EXCLUDED.expires_at
    RETURNING k.key
)
SELECT pg_notify('{CHANNEL}', md5(key)) FROM stored
"""

EVENT_SEEN = "SELECT 1 FROM limiter_keys WHERE key = %(key)s AND expires_at > now() AND value > 0"

# A group member's arrival at its barrier (created by Barrier.create: add(key, parties)):
# counted once per member, the barrier decremented under its row lock; the member that
# brings it to 0 is the last. No row back: this member had arrived already, or the
# barrier is gone (expired).
ARRIVE = f"""
WITH arrived AS (
    INSERT INTO group_arrivals (barrier, member, expires_at) VALUES (%(key)s, %(member)s, {_EXPIRES})
    ON CONFLICT DO NOTHING
    RETURNING barrier
)
UPDATE limiter_keys k SET value = k.value - 1
  FROM arrived
 WHERE k.key = arrived.barrier AND k.expires_at > now()
RETURNING k.value
"""

# --- the fan-in of a group step (supervisor.pipeline) -------------------------------------

FANIN_OPEN = f"""
INSERT INTO pipeline_fanins (id, size, expires_at) VALUES (%(id)s, %(size)s, {_EXPIRES})
ON CONFLICT (id) DO NOTHING
"""

# A member's result, once (a member run again writes nothing), then the count under the
# fan-in's row lock: the arrival that makes it whole sends the next step.
FANIN_ARRIVE = """
WITH stored AS (
    INSERT INTO pipeline_fanin_results (fanin, member, value) VALUES (%(id)s, %(member)s, %(value)s)
    ON CONFLICT DO NOTHING
    RETURNING fanin
)
UPDATE pipeline_fanins f SET arrived = f.arrived + 1
  FROM stored
 WHERE f.id = stored.fanin
RETURNING f.arrived, f.size, f.failed
"""

FANIN_RESULTS = "SELECT value FROM pipeline_fanin_results WHERE fanin = %(id)s ORDER BY member"

# A member failed for good: the first reason is kept; the rest of the pipeline never runs.
FANIN_FAIL = f"""
INSERT INTO pipeline_fanins AS f (id, size, failed, expires_at) VALUES (%(id)s, %(size)s, %(reason)s, {_EXPIRES})
ON CONFLICT (id) DO UPDATE SET failed = coalesce(f.failed, EXCLUDED.failed)
RETURNING f.failed
"""

FANIN_STATE = "SELECT size, arrived, failed FROM pipeline_fanins WHERE id = %(id)s"

# --- retention (the upkeep's prune, in bounded batches) ----------------------------------
# The outer expires_at check is made again on a row a concurrent add() brought back to
# life while the batch waited for it: such a row stays.

PRUNE_KEYS = """
DELETE FROM limiter_keys WHERE key IN (
    SELECT key FROM limiter_keys WHERE expires_at < now() ORDER BY expires_at LIMIT %(limit)s)
   AND expires_at < now()
"""

PRUNE_ARRIVALS = """
DELETE FROM group_arrivals WHERE (barrier, member) IN (
    SELECT barrier, member FROM group_arrivals WHERE expires_at < now() ORDER BY expires_at LIMIT %(limit)s)
"""

PRUNE_FANINS = """
DELETE FROM pipeline_fanins WHERE id IN (
    SELECT id FROM pipeline_fanins WHERE expires_at < now() ORDER BY expires_at LIMIT %(limit)s)
"""

PRUNES = {"limiter keys": PRUNE_KEYS, "group arrivals": PRUNE_ARRIVALS, "pipeline fan-ins": PRUNE_FANINS}
