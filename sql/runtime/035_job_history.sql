-- The job path's storage: live work and finished jobs in separate tables.
--
-- job_queue (the old jobs table, renamed) holds only live rows: pending, retryable and
-- running. A job that finishes (succeeded, failed, cancelled) is deleted from it and
-- appended to job_history in the same statement. So the table the claim reads stays as
-- small as the backlog, its indexes carry no finished rows, and retention never deletes
-- from it (ARCHITECTURE.md, "Storage").
--
-- job_history is partitioned by status (each has its own retention), then by the day a
-- job finished. Retention drops a whole day (job_history_drop_before): no DELETE of
-- millions of rows, no vacuum after it. Days are created ahead by the upkeep
-- (job_history_add_day); a row finishing on a day with no partition yet lands in the
-- status's default partition, which retention empties row by row.
--
-- jobs is now a view over both, with the old columns: the dashboard, the API, the CLI
-- and an operator's own SQL read (and, through the INSTEAD OF trigger below, write) one
-- jobs table as before. The runtime's own statements name job_queue or job_history.

ALTER TABLE jobs RENAME TO job_queue;

-- Indexes that served finished rows only: job_history has its own.
DROP INDEX IF EXISTS jobs_finished;
DROP INDEX IF EXISTS jobs_failed;
-- Every version of every live row paid an entry here (three per job); the live table's
-- lists sort the backlog instead, history has its own (created_at, id).
DROP INDEX IF EXISTS jobs_created_id;

CREATE TABLE job_history (LIKE job_queue INCLUDING DEFAULTS) PARTITION BY LIST (status);
ALTER TABLE job_history ALTER COLUMN finished_at SET NOT NULL;
CREATE TABLE job_history_succeeded PARTITION OF job_history FOR VALUES IN ('succeeded') PARTITION BY RANGE (finished_at);
CREATE TABLE job_history_failed PARTITION OF job_history FOR VALUES IN ('failed') PARTITION BY RANGE (finished_at);
CREATE TABLE job_history_cancelled PARTITION OF job_history FOR VALUES IN ('cancelled') PARTITION BY RANGE (finished_at);
CREATE TABLE job_history_succeeded_default PARTITION OF job_history_succeeded DEFAULT;
CREATE TABLE job_history_failed_default PARTITION OF job_history_failed DEFAULT;
CREATE TABLE job_history_cancelled_default PARTITION OF job_history_cancelled DEFAULT;
-- A job page looks a job up by id; lists read newest first; the pages of the last hour
-- or day (Actors, Errors, start waits, finished per minute) read a window of finished_at.
CREATE INDEX job_history_id ON job_history (id);
CREATE INDEX job_history_created ON job_history (created_at, id);
CREATE INDEX job_history_finished ON job_history (finished_at);

-- One day of one status: [day, day + 1) in the server's time zone at creation. Created as
-- a plain table, then attached: CREATE TABLE ... PARTITION OF would lock the parent
-- against every reader and writer; ATTACH takes a lock that lets inserts and reads go
-- on. The CHECK spares ATTACH a scan of the new table. The default partition is scanned
-- for rows of that day (none, normally: days are made ahead); if it has some, the day
-- is not made (false) and retention removes those rows from the default.
CREATE FUNCTION job_history_add_day(st text, day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := format('job_history_%s_d%s', st, to_char(day, 'YYYYMMDD'));
    parent text := format('job_history_%s', st);
    lo timestamptz := day::timestamptz;
    hi timestamptz := (day + 1)::timestamptz;
    taken boolean;
BEGIN
    IF st NOT IN ('succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'job_history has no status %', st;
    END IF;
    IF to_regclass(part) IS NOT NULL THEN
        RETURN true;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE finished_at >= %L AND finished_at < %L)',
                   parent || '_default', lo, hi) INTO STRICT taken;
    IF taken THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS, CHECK (status = %L AND finished_at >= %L AND finished_at < %L))',
                   part, parent, st, lo, hi);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, part, lo, hi);
    RETURN true;
END $$;

-- Drop every day of a status that ended before the cutoff; how many rows went (the
-- planner's count, not a scan). A partition another session holds is left for the next
-- round (the caller sets lock_timeout).
CREATE FUNCTION job_history_drop_before(st text, cutoff timestamptz) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    part record;
    dropped bigint := 0;
BEGIN
    FOR part IN
        SELECT c.relname, greatest(c.reltuples, 0)::bigint AS rows
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = to_regclass(format('job_history_%s', st))
           AND c.relname ~ '_d[0-9]{8}$'
           AND (to_date(right(c.relname, 8), 'YYYYMMDD') + 1)::timestamptz <= cutoff
         ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        dropped := dropped + part.rows;
    END LOOP;
    RETURN dropped;
END $$;

DO $$
DECLARE st text; d int;
BEGIN
    FOREACH st IN ARRAY ARRAY['succeeded', 'failed', 'cancelled'] LOOP
        FOR d IN -1..2 LOOP
            PERFORM job_history_add_day(st, current_date + d);
        END LOOP;
    END LOOP;
END $$;

-- Finished rows move in place, in this transaction (a worker of the old version is
-- stopped while it runs: its ack would name a table that is gone).
WITH moved AS (
    DELETE FROM job_queue WHERE status IN ('succeeded', 'failed', 'cancelled')
    RETURNING id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload
)
INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload)
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner,
       claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress,
       created_at, started_at, coalesce(finished_at, started_at, claimed_at, created_at), lease_losses,
       max_lease_losses, message_timestamp, payload
  FROM moved;

ALTER TABLE job_queue DROP CONSTRAINT jobs_status_check;
-- A live row is never cancelled in place any more (CANCEL moves it and notifies).
DROP TRIGGER jobs_notify_cancel ON job_queue;
ALTER TABLE job_queue ADD CONSTRAINT job_queue_live CHECK (status IN ('pending', 'retryable', 'running'));

CREATE VIEW jobs AS
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload FROM job_queue
UNION ALL
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload FROM job_history;

-- Writes through the view go to the table that holds (or will hold) the row; a row
-- whose status crosses between live and finished moves. The runtime never writes here.
CREATE FUNCTION jobs_view_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.status IN ('pending', 'retryable', 'running') THEN
            IF TG_OP = 'UPDATE' AND NEW.status IN ('pending', 'retryable', 'running') THEN
                UPDATE job_queue SET (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload) = (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload) WHERE id = OLD.id;
                RETURN NEW;
            END IF;
            DELETE FROM job_queue WHERE id = OLD.id;
            IF OLD.status = 'running' AND TG_OP = 'UPDATE' AND NEW.status = 'cancelled' THEN
                PERFORM pg_notify('actor_supervisor_cancel', OLD.id::text);  -- its process interrupts it
            END IF;
        ELSE
            IF TG_OP = 'UPDATE' AND NEW.status NOT IN ('pending', 'retryable', 'running') THEN
                UPDATE job_history SET (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload) = (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload) WHERE id = OLD.id AND status = OLD.status;
                RETURN NEW;
            END IF;
            DELETE FROM job_history WHERE id = OLD.id AND status = OLD.status;
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    IF NEW.status IN ('pending', 'retryable', 'running') THEN
        INSERT INTO job_queue (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload) VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload);
    ELSE
        NEW.finished_at := coalesce(NEW.finished_at, now());
        INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload) VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_view_write INSTEAD OF INSERT OR UPDATE OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_view_write();

-- The view's defaults, for INSERTs that leave columns out (as they did on the table).
ALTER VIEW jobs ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER VIEW jobs ALTER COLUMN queue SET DEFAULT 'default';
ALTER VIEW jobs ALTER COLUMN args SET DEFAULT '[]';
ALTER VIEW jobs ALTER COLUMN kwargs SET DEFAULT '{}';
ALTER VIEW jobs ALTER COLUMN options SET DEFAULT '{}';
ALTER VIEW jobs ALTER COLUMN status SET DEFAULT 'pending';
ALTER VIEW jobs ALTER COLUMN priority SET DEFAULT 0;
ALTER VIEW jobs ALTER COLUMN run_at SET DEFAULT now();
ALTER VIEW jobs ALTER COLUMN attempts SET DEFAULT 0;
ALTER VIEW jobs ALTER COLUMN lease_losses SET DEFAULT 0;
ALTER VIEW jobs ALTER COLUMN created_at SET DEFAULT now();

-- The capacity view's finished counts now read history (after the rename they read the
-- live table, which holds no finished row).
DROP VIEW v_queue_capacity;
CREATE VIEW v_queue_capacity AS
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending' AND run_at <= now())                AS ready,
           count(*) FILTER (WHERE status IN ('pending', 'retryable') AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running')                                    AS running,
           count(*) FILTER (WHERE status = 'retryable' AND run_at <= now())              AS retryable
      FROM jobs_live
     GROUP BY queue
), done AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'succeeded')                                  AS succeeded_1h,
           count(*) FILTER (WHERE status = 'failed')                                     AS failed_1h,
           avg(extract(epoch FROM finished_at - started_at)) FILTER (WHERE status = 'succeeded')
                                                                                         AS avg_duration_s,
           count(*) FILTER (WHERE status IN ('succeeded', 'failed'))                     AS finished_1h,
           count(DISTINCT lease_owner) FILTER (WHERE status IN ('succeeded', 'failed'))  AS busy_workers_1h
      FROM job_history
     WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at > now() - interval '1 hour'
     GROUP BY queue
), w AS (
    SELECT q AS queue, count(*) AS active_workers, coalesce(sum(capacity), 0) AS capacity,
           coalesce(sum(jobs_in_flight), 0) AS in_flight
      FROM workers CROSS JOIN LATERAL unnest(queues) AS q
     WHERE stopped_at IS NULL AND role <> 'master' AND heartbeat_at > now() - interval '1 minute'
     GROUP BY q
), names AS (
    SELECT queue FROM live UNION SELECT queue FROM done UNION SELECT queue FROM w
    UNION SELECT queue FROM queue_pauses
), rates AS (
    SELECT n.queue,
           coalesce(l.ready, 0) AS ready, coalesce(l.scheduled, 0) AS scheduled,
           coalesce(l.running, 0) AS running, coalesce(l.retryable, 0) AS retryable,
           coalesce(d.succeeded_1h, 0) AS succeeded_1h, coalesce(d.failed_1h, 0) AS failed_1h,
           round(d.avg_duration_s::numeric, 3)::float8 AS avg_duration_s,
           coalesce(w.active_workers, 0) AS active_workers, coalesce(w.capacity, 0) AS capacity,
           coalesce(w.in_flight, 0) AS in_flight,
           (d.finished_1h::float8 / nullif(d.busy_workers_1h, 0)) AS throughput_per_worker_hour,
           coalesce(l.ready, 0) + coalesce(l.scheduled, 0) + coalesce(l.running, 0) + coalesce(l.retryable, 0)
               AS backlog,
           p.queue IS NOT NULL AS paused, p.reason AS paused_reason
      FROM names n
      LEFT JOIN live l ON l.queue = n.queue
      LEFT JOIN done d ON d.queue = n.queue
      LEFT JOIN w ON w.queue = n.queue
      LEFT JOIN queue_pauses p ON p.queue = n.queue
)
SELECT rates.*,
       CASE WHEN backlog = 0 THEN 0
            ELSE round((backlog * 3600.0 / nullif(throughput_per_worker_hour * active_workers, 0))::numeric, 1)::float8
       END AS drain_seconds,
       CASE WHEN backlog = 0 THEN 0 ELSE ceil(backlog / throughput_per_worker_hour)::int END AS workers_needed_1h,
       CASE WHEN backlog = 0 THEN 0 ELSE ceil(backlog / (4 * throughput_per_worker_hour))::int END AS workers_needed_4h,
       CASE WHEN backlog = 0 THEN 0 ELSE ceil(backlog / (8 * throughput_per_worker_hour))::int END AS workers_needed_8h
  FROM rates;
