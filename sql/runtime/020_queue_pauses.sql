-- A paused queue gets no new claims (running jobs finish). One row per paused
-- queue; resuming deletes it. IF NOT EXISTS: the same table may come from the
-- branch that makes the workers honour it.
CREATE TABLE IF NOT EXISTS queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL,
    reason    text
);
