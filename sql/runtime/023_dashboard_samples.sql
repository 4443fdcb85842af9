-- History the dashboard's charts draw, kept in PostgreSQL so it survives a restart
-- of the HTTP child. The HTTP child's recorder writes one row per live process and
-- one per queue every sample period (10 s); the primary key is the period, so two
-- HTTP children (two hosts) sampling at once write each row once. Pruned past 25 h.
-- A queue row also counts the jobs that finished in the period before last (one
-- period of slack for commits in flight), so 6 h and 24 h charts and rates read a
-- few thousand rollup rows, never a day of jobs.
CREATE TABLE process_samples (
    at             timestamptz NOT NULL,
    worker_id      text        NOT NULL,
    role           text        NOT NULL,
    host           text        NOT NULL,
    rss_bytes      bigint,
    cpu_percent    real,
    jobs_in_flight integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (worker_id, at)
);
CREATE INDEX process_samples_at ON process_samples (at);

CREATE TABLE queue_samples (
    at        timestamptz NOT NULL,
    queue     text        NOT NULL,
    ready     integer     NOT NULL,
    scheduled integer     NOT NULL,
    running   integer     NOT NULL,
    retryable integer     NOT NULL,
    succeeded integer     NOT NULL DEFAULT 0,
    failed    integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, at)
);
CREATE INDEX queue_samples_at ON queue_samples (at);
