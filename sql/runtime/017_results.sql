-- Results of actors that store them (Dramatiq's Results middleware with
-- supervisor.results.PostgresBackend). Keyed by the backend's message key;
-- a row past expires_at is as good as gone and the prune deletes it.
CREATE TABLE job_results (
    key        text        PRIMARY KEY,
    job_id     uuid,
    value      bytea       NOT NULL,   -- the backend encoder's bytes
    stored_at  timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX job_results_expires ON job_results (expires_at);
CREATE INDEX job_results_stored ON job_results (stored_at);
