-- Progress reported by running actors (supervisor.progress): one row per report
-- that reached the database (reports are coalesced per process, so a job that
-- reports ten times in a few milliseconds may leave fewer rows). jobs.progress
-- holds the latest report.
CREATE TABLE job_progress (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id  uuid        NOT NULL,
    at      timestamptz NOT NULL,
    percent real,
    message text
);
CREATE INDEX job_progress_job ON job_progress (job_id, at);
CREATE INDEX job_progress_at ON job_progress (at);
