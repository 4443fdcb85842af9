"""Every statement on ``job_keys`` (migration 052): the dedupe keys of live jobs, one row a
key naming its holder, for every store (a job_queue row's insert takes its key by trigger).

A producer's log job with a dedupe key (and no concurrency or limit key) takes its key in
the statement that writes it (``job_keys_take``: a new key inserted, a key whose holder
ended taken over, in key order; each key left locked until the transaction ends) and is
written only if it got the key; a key a live job holds comes back with that job's id,
which the producer gives the caller instead. Nothing releases a key: it is free once its
holder is no longer live (``job_key_live``), and the upkeep deletes such rows (PRUNE_KEYS).
No claim reads this table.
"""

from .joblog import LOG_COLUMNS

# A deduped log row's columns: the log's, then its key (a plain row leaves it NULL,
# unwritten), and its limit key and limits (053: NULL unless its key has a concurrency limit).
KEYED_COLUMNS = f"{LOG_COLUMNS}, dedupe_key, flow_key, flow"

_KEYED_ROWS = f"""unnest(%(id)s::uuid[], %(queue)s::text[], %(actor)s::text[], %(args)s::jsonb[], %(kwargs)s::jsonb[],
              %(options)s::jsonb[], %(payload)s::bytea[], %(priority)s::int[], %(max_attempts)s::int[],
              %(max_lease_losses)s::int[], %(message_timestamp)s::bigint[], %(dedupe_key)s::text[],
              %(flow_key)s::text[], %(flow)s::jsonb[])
    AS m({KEYED_COLUMNS})"""

# Keyed rows (each key once: the producer keeps a key's first message) taken and written in
# one statement: the rows whose key this statement took go in, due now (the log) or at now()
# + delay_ms (job_timers); a message whose id a live job has is not written again (as
# LOG_INSERT_ONE, TIMER_INSERT). Returns every key with its holder (text): the row's own id,
# or the live job that holds the key.
_TAKE_AND_WRITE = """
WITH k AS MATERIALIZED (
    SELECT t.key, t.job_id FROM job_keys_take(%(dedupe_key)s::text[], %(id)s::uuid[]) t
), put AS (
    INSERT INTO {table} ({columns})
    SELECT m.*{run_at} FROM {rows} JOIN k ON k.key = m.dedupe_key AND k.job_id = m.id
     WHERE NOT job_id_live(m.id){again}
    {conflict}
)
SELECT k.key, k.job_id::text FROM k
"""
# Written again on a fresh connection (sending.py): any row of the log with the id means
# the first write went in (its job may have run since), as LOG_INSERT_AGAIN.
_AGAIN = "\n       AND NOT EXISTS (SELECT 1 FROM job_log l WHERE l.id = m.id)"


def _take_and_write(table: str, *, again: bool) -> str:
    timed = table == "job_timers"
    return _TAKE_AND_WRITE.format(
        table=table, columns=KEYED_COLUMNS + (", run_at" if timed else ""), rows=_KEYED_ROWS,
        run_at=", now() + %(delay_ms)s * interval '1 millisecond'" if timed else "",
        again=_AGAIN if again else "", conflict="ON CONFLICT (id) DO NOTHING" if timed else "")


LOG_INSERT_KEYED = _take_and_write("job_log", again=False)
LOG_INSERT_KEYED_AGAIN = _take_and_write("job_log", again=True)
TIMER_INSERT_KEYED = _take_and_write("job_timers", again=False)
TIMER_INSERT_KEYED_AGAIN = _take_and_write("job_timers", again=True)

# A COPY batch's keys, taken in one statement before its COPY (in the same transaction):
# each key with its holder, as above. The rows whose key went to another job are left out.
TAKE_KEYS = "SELECT key, job_id::text FROM job_keys_take(%(keys)s::text[], %(ids)s::uuid[])"

# A batch with keyed rows: every row with its key column (NULL for a plain one).
LOG_COPY_KEYED = f"COPY job_log ({KEYED_COLUMNS}) FROM STDIN"

# The live holders of keys, whichever store holds them (job_queue's own index too: its rows
# from before 052 took no key row until the migration's copy): a batch's look-up of the keys
# it did not write (bulk.py, sending.insert_one).
LIVE_BY_DEDUPE_KEYS = """
SELECT dedupe_key, id FROM job_queue WHERE dedupe_key = ANY(%(keys)s::text[])
UNION
SELECT key, job_id FROM job_keys_live(%(keys)s::text[])
"""

# The upkeep: of up to ``limit`` keys after ``after`` (NULL: the first), delete those whose
# holder ended (job_keys_prune); returns how many went and the last key read (NULL: the end).
PRUNE_KEYS = "SELECT pruned, upto FROM job_keys_prune(%(after)s, %(limit)s)"
