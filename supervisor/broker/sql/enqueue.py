"""Writing jobs: one message, or a batch (INSERT of arrays, or COPY). (A batch's look-up of
its keys' live holders, LIVE_BY_DEDUPE_KEYS, is jobkeys.py's: job_keys holds every store's.)"""

# A row with a limit key (flow control, supervisor/flow.py) waits for its key: 'waiting'.
INSERT = """
INSERT INTO job_queue (id, queue, actor, args, kwargs, options, priority, run_at,
                  max_attempts, dedupe_key, concurrency_key, message_timestamp, payload, flow_key, flow, status)
VALUES (%(id)s, %(queue)s, %(actor)s, %(args)s, %(kwargs)s, %(options)s, %(priority)s,
        now() + %(delay_ms)s * interval '1 millisecond', %(max_attempts)s,
        %(dedupe_key)s, %(concurrency_key)s, %(message_timestamp)s, %(payload)s, %(flow_key)s, %(flow)s::jsonb,
        CASE WHEN %(flow_key)s::text IS NULL THEN 'pending' ELSE 'waiting' END)
ON CONFLICT DO NOTHING
RETURNING id
"""

# The bulk path (bulk.py). Its rows carry these columns in this order; run_at,
# now() + the batch's delay, is the same for every row of a batch.
BULK_COLUMNS = """id, queue, actor, args, kwargs, options, payload, priority, max_attempts, dedupe_key,
    concurrency_key, message_timestamp"""

# A batch with rows that wait for a limit key carries two more columns (FLOW_COLUMNS).
FLOW_COLUMNS = "flow_key, flow"

# A small batch, or one the COPY could not take: one statement, arrays in
# (one per column, in BULK_COLUMNS then FLOW_COLUMNS order, after the delay; the flow
# arrays NULL when no row has a limit key), ids of new rows out.
INSERT_MANY = f"""
INSERT INTO job_queue ({BULK_COLUMNS}, {FLOW_COLUMNS}, status, run_at)
SELECT m.*, CASE WHEN m.flow_key IS NULL THEN 'pending' ELSE 'waiting' END, now() + %s * interval '1 millisecond'
  FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::jsonb[], %s::jsonb[], %s::jsonb[], %s::bytea[],
              %s::int[], %s::int[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::jsonb[])
       AS m(id, queue, actor, args, kwargs, options, payload, priority, max_attempts, dedupe_key,
            concurrency_key, message_timestamp, flow_key, flow)
ON CONFLICT DO NOTHING
RETURNING id
"""

# A large batch streams its rows in (text format), inside a savepoint: a unique
# violation rolls it back and the batch goes through INSERT_MANY instead. The
# statement-level NOTIFY trigger fires for COPY as for INSERT. run_at is left to
# its default, now(), unless the batch is delayed: then every row carries RUN_AT,
# read once in the same transaction (so it is the same now()).
COPY_JOBS = f"COPY job_queue ({BULK_COLUMNS}) FROM STDIN"

COPY_JOBS_AT = f"COPY job_queue ({BULK_COLUMNS}, run_at) FROM STDIN"

# A batch with rows that wait for a limit key: each row carries its key, limits and status.
COPY_FLOW_JOBS = f"COPY job_queue ({BULK_COLUMNS}, {FLOW_COLUMNS}, status) FROM STDIN"

COPY_FLOW_JOBS_AT = f"COPY job_queue ({BULK_COLUMNS}, {FLOW_COLUMNS}, status, run_at) FROM STDIN"

RUN_AT = "SELECT now() + %s * interval '1 millisecond'"
