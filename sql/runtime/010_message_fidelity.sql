-- A worker receives exactly the message that was sent (Dramatiq drop-in).

-- Dramatiq's own message_timestamp (ms since the epoch), kept as sent. NULL for
-- rows written by plain SQL: the claim then reports created_at.
ALTER TABLE jobs ADD COLUMN message_timestamp bigint;

-- The message as a non-JSON encoder (Pickle, a user's own) encoded it. NULL when
-- Dramatiq's JSONEncoder is configured: args, kwargs and options hold the message
-- as readable jsonb. When set, those columns keep their defaults.
ALTER TABLE jobs ADD COLUMN payload bytea;

-- Wake-ups: a row due now sends its queue's name, as before; a row due later sends
-- '@' || queue, so each process serving that queue moves its timer to the
-- earliest run_at instead of waiting for the poll.
CREATE OR REPLACE FUNCTION jobs_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('actor_supervisor_jobs', CASE WHEN q.due THEN q.queue ELSE '@' || q.queue END)
       FROM (SELECT DISTINCT queue, run_at <= now() AS due FROM new_rows) AS q;
    RETURN NULL;
END $$;
