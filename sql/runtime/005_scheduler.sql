-- Cron schedules: a lease per schedule so one host fires each fire time, and a
-- history of runs.

-- Acquire: INSERT ... ON CONFLICT DO UPDATE ... WHERE the lease expired and the
-- fire time is newer than the last one fired, RETURNING the row (no row: not ours).
-- Release: expire the lease but keep fire_at, so a host whose clock runs late
-- cannot fire the same time again after the release.
CREATE TABLE scheduler_locks (
    job_name    text        PRIMARY KEY,
    lock_holder text        NOT NULL,
    locked_at   timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    fire_at     timestamptz              -- the cron time the holder fired
);

CREATE TABLE job_runs (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_name      text        NOT NULL,
    scheduled_for timestamptz,
    holder        text,
    started_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    status        text        NOT NULL DEFAULT 'running'
                  CHECK (status IN ('running', 'succeeded', 'failed', 'crashed', 'skipped')),
    job_id        uuid,                  -- the enqueued job whose outcome this run reports
    error_text    text,
    rows_affected integer
);
CREATE INDEX job_runs_name_started ON job_runs (job_name, started_at DESC);
CREATE INDEX job_runs_running ON job_runs (started_at) WHERE status = 'running';
CREATE UNIQUE INDEX job_runs_once ON job_runs (job_name, scheduled_for);
