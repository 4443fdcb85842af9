-- A paused queue gets no claims (see the claim in supervisor/broker/sql.py);
-- running jobs finish. Resuming NOTIFYs the queue so idle consumers claim at once.
CREATE TABLE IF NOT EXISTS queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text,
    reason    text
);
