-- Jobs are Dramatiq messages stored as rows (DESIGN §3).

CREATE TABLE jobs (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    queue            text        NOT NULL DEFAULT 'default',
    actor            text        NOT NULL,
    args             jsonb       NOT NULL DEFAULT '[]',
    kwargs           jsonb       NOT NULL DEFAULT '{}',
    options          jsonb       NOT NULL DEFAULT '{}',
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'retryable', 'succeeded', 'failed', 'cancelled')),
    priority         integer     NOT NULL DEFAULT 0,          -- higher runs first
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0,          -- claims so far; also the lease fence
    max_attempts     integer     NOT NULL DEFAULT 21 CHECK (max_attempts >= 1),
    lease_owner      text,
    claimed_at       timestamptz,
    heartbeat_at     timestamptz,
    lease_expires_at timestamptz,
    dedupe_key       text,
    concurrency_key  text,
    last_error       text,
    result           jsonb,
    progress         jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);

-- The claim reads only runnable rows, in claim order: finished rows (millions of
-- them) are not in this index at all, so the claim stays one short index scan.
CREATE INDEX jobs_claim ON jobs (queue, priority DESC, run_at, id)
    WHERE status IN ('pending', 'retryable');

-- Heartbeat renews "my running jobs"; the reaper looks for expired leases.
CREATE INDEX jobs_running_owner ON jobs (lease_owner) WHERE status = 'running';
CREATE INDEX jobs_running_expiry ON jobs (lease_expires_at) WHERE status = 'running';

-- At most one live job per dedupe key.
CREATE UNIQUE INDEX jobs_dedupe_live ON jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'retryable', 'running');

-- Retention prunes finished rows oldest first.
CREATE INDEX jobs_finished ON jobs (finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');

-- One row per concurrency key that has a running job. A claim takes the slot with
-- INSERT ... ON CONFLICT DO NOTHING, which is race-free without errors or waits
-- on unrelated rows; the trigger below frees it on every way out of 'running'.
CREATE TABLE job_concurrency (
    key    text PRIMARY KEY,
    job_id uuid NOT NULL
);

CREATE FUNCTION jobs_release_concurrency() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_concurrency WHERE key = OLD.concurrency_key AND job_id = OLD.id;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_release_concurrency_upd
    AFTER UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION jobs_release_concurrency();

CREATE TRIGGER jobs_release_concurrency_del
    AFTER DELETE ON jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'running')
    EXECUTE FUNCTION jobs_release_concurrency();

-- Wake idle consumers as soon as an INSERT commits, whoever wrote it (actor.send,
-- bulk enqueue or plain SQL). One notification per queue per statement.
CREATE FUNCTION jobs_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('actor_supervisor_jobs', q.queue)
       FROM (SELECT DISTINCT queue FROM new_rows WHERE run_at <= now()) AS q;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_notify_insert
    AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    EXECUTE FUNCTION jobs_notify_insert();

-- State changes that matter (retry, failure, reclaim, release, requeue, cancel).
CREATE TABLE job_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    who         text        NOT NULL,
    from_status text,
    to_status   text        NOT NULL,
    reason      text
);
CREATE INDEX job_events_job ON job_events (job_id, at);
CREATE INDEX job_events_at ON job_events (at);

-- One row per worker process (and master), many hosts per database.
CREATE TABLE workers (
    id             text        PRIMARY KEY,          -- also the lease owner of its jobs
    host           text        NOT NULL,
    pid            integer     NOT NULL,
    role           text        NOT NULL,
    queues         text[]      NOT NULL DEFAULT '{}',
    state          text        NOT NULL DEFAULT 'starting',
    started_at     timestamptz NOT NULL DEFAULT now(),
    heartbeat_at   timestamptz NOT NULL DEFAULT now(),
    stopped_at     timestamptz,
    rss_bytes      bigint,
    cpu_percent    real,
    jobs_in_flight integer     NOT NULL DEFAULT 0,
    jobs_done      bigint      NOT NULL DEFAULT 0
);
CREATE INDEX workers_heartbeat ON workers (heartbeat_at);
