-- Flow control (issue 22): rate limits, daily quotas, concurrency limits per key and fair
-- shares between keys, applied by the claim (supervisor/broker/sql/flow.py).
--
-- A job with flow control carries its limit key (flow_key) and its limits (flow: r rate per
-- second, b burst, q daily quota, c concurrency, w weight) and waits as status 'waiting':
-- outside jobs_claim, so the claim's scan of a queue's runnable rows never walks a key's
-- backlog. The claim reaches waiting rows by key (jobs_waiting), key after key in turn,
-- taking from a key only what its bucket (rate_limiter_state, the one limiter table, shared
-- with take() in supervisor/ratelimit.py), its quota and its free slots (job_concurrency)
-- allow. jobs_waiting_due finds a queue's next delayed waiting row for the due timer.

ALTER TABLE job_queue ADD COLUMN flow_key text, ADD COLUMN flow jsonb;

-- A claim updates the bucket of each key it takes from: room on the page keeps that a HOT
-- update (no new index entry), as the heartbeat's.
ALTER TABLE rate_limiter_state SET (fillfactor = 50);
ALTER TABLE job_history ADD COLUMN flow_key text, ADD COLUMN flow jsonb;

ALTER TABLE job_queue DROP CONSTRAINT job_queue_live;
ALTER TABLE job_queue ADD CONSTRAINT job_queue_live CHECK (status IN ('pending', 'retryable', 'running', 'waiting'));

CREATE INDEX jobs_waiting ON job_queue (queue, flow_key, priority DESC, run_at, id) WHERE status = 'waiting';
CREATE INDEX jobs_waiting_due ON job_queue (queue, run_at) WHERE status = 'waiting';

-- Up to N running jobs per key: slot 0..N-1 each (a claim takes a free one with INSERT ...
-- ON CONFLICT DO NOTHING, as the single slot was taken before). concurrency_key alone is slot 0.
ALTER TABLE job_concurrency ADD COLUMN slot integer NOT NULL DEFAULT 0;
ALTER TABLE job_concurrency DROP CONSTRAINT job_concurrency_pkey;
ALTER TABLE job_concurrency ADD PRIMARY KEY (key, slot);

-- Wake-ups for waiting rows say so: '+' || queue (a process that claims the queue without
-- reading waiting rows starts to: broker/gates.py), and '@' || queue too for one due later.
CREATE OR REPLACE FUNCTION jobs_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('actor_supervisor_jobs', w.payload)
       FROM (SELECT DISTINCT CASE WHEN q.waiting THEN '+' || q.queue WHEN q.due THEN q.queue END AS payload
               FROM (SELECT DISTINCT queue, run_at <= now() AS due, status = 'waiting' AS waiting FROM new_rows) AS q
             UNION
             SELECT DISTINCT '@' || queue FROM new_rows WHERE run_at > now()) AS w
      WHERE w.payload IS NOT NULL;
    RETURN NULL;
END $$;

-- A slot freed wakes the queue's consumers: a waiting job of its key may run now.
CREATE OR REPLACE FUNCTION jobs_release_concurrency() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_concurrency WHERE key = coalesce(OLD.flow_key, OLD.concurrency_key) AND job_id = OLD.id;
    IF FOUND AND OLD.flow_key IS NOT NULL THEN
        PERFORM pg_notify('actor_supervisor_jobs', '+' || OLD.queue);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER jobs_release_concurrency_upd ON job_queue;
CREATE TRIGGER jobs_release_concurrency_upd
    AFTER UPDATE OF status ON job_queue
    FOR EACH ROW
    WHEN ((OLD.concurrency_key IS NOT NULL OR OLD.flow_key IS NOT NULL)
          AND OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION jobs_release_concurrency();

DROP TRIGGER jobs_release_concurrency_del ON job_queue;
CREATE TRIGGER jobs_release_concurrency_del
    AFTER DELETE ON job_queue
    FOR EACH ROW
    WHEN ((OLD.concurrency_key IS NOT NULL OR OLD.flow_key IS NOT NULL) AND OLD.status = 'running')
    EXECUTE FUNCTION jobs_release_concurrency();

-- The views show the new columns and count waiting rows as live.
CREATE OR REPLACE VIEW jobs AS
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow FROM job_queue
UNION ALL
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow FROM job_history;

CREATE OR REPLACE FUNCTION jobs_view_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.status IN ('pending', 'retryable', 'running', 'waiting') THEN
            IF TG_OP = 'UPDATE' AND NEW.status IN ('pending', 'retryable', 'running', 'waiting') THEN
                UPDATE job_queue SET (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) = (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow) WHERE id = OLD.id;
                RETURN NEW;
            END IF;
            DELETE FROM job_queue WHERE id = OLD.id;
            IF OLD.status = 'running' AND TG_OP = 'UPDATE' AND NEW.status = 'cancelled' THEN
                PERFORM pg_notify('actor_supervisor_cancel', OLD.id::text);  -- its process interrupts it
            END IF;
        ELSE
            IF TG_OP = 'UPDATE' AND NEW.status NOT IN ('pending', 'retryable', 'running', 'waiting') THEN
                UPDATE job_history SET (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) = (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow) WHERE id = OLD.id AND status = OLD.status;
                RETURN NEW;
            END IF;
            DELETE FROM job_history WHERE id = OLD.id AND status = OLD.status;
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    -- A row written by hand with a limit key waits for its key, as the producer's do.
    IF TG_OP = 'INSERT' AND NEW.flow_key IS NOT NULL AND NEW.status = 'pending' THEN
        NEW.status := 'waiting';
    END IF;
    IF NEW.status IN ('pending', 'retryable', 'running', 'waiting') THEN
        INSERT INTO job_queue (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow);
    ELSE
        NEW.finished_at := coalesce(NEW.finished_at, now());
        INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow);
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE VIEW jobs_live AS
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM job_queue WHERE status IN ('pending', 'retryable')
UNION ALL
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM job_queue WHERE status = 'running' AND claimed_at IS NOT NULL
UNION ALL
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM job_queue WHERE status = 'waiting';

-- Waiting rows count as ready (due) or scheduled (not yet), as pending ones do.
CREATE OR REPLACE VIEW v_queue_capacity AS
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE status IN ('pending', 'waiting') AND run_at <= now())   AS ready,
           count(*) FILTER (WHERE status IN ('pending', 'retryable', 'waiting') AND run_at > now())
                                                                                         AS scheduled,
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
