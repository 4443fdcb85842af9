-- 047: Dramatiq's rate limiters, Barrier and group completion callbacks on PostgreSQL
-- (supervisor.rate_limits.PostgresBackend), and the fan-in of a group inside a pipeline
-- (supervisor.pipeline). Every statement on these tables: supervisor/broker/sql/limiter.py.

-- One counter per key, as Dramatiq's Redis backend keeps one string per key with a TTL:
-- a row past expires_at reads as absent (every statement checks it), and the upkeep's
-- prune deletes it in bounded batches. No index but the key's: every acquire and release
-- of a limiter updates value and expires_at, and with neither indexed (and room left on
-- the page) that update is HOT, no index entry per call on a busy key; the prune reads
-- the whole table, a few rows per live limiter key.
CREATE TABLE limiter_keys (
    key        text        PRIMARY KEY,
    value      bigint      NOT NULL,
    expires_at timestamptz NOT NULL
) WITH (fillfactor = 50);

-- A group member that reached its completion barrier, by message id: a member run again
-- (its process killed between its arrival and its ack) does not count twice, and the
-- callbacks are sent in the arrival's transaction by the member that counts the last.
CREATE TABLE group_arrivals (
    barrier    text        NOT NULL,
    member     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (barrier, member)
);
CREATE INDEX group_arrivals_expires ON group_arrivals (expires_at);

-- A group step of a pipeline: its size, the members arrived so far and, once a member
-- failed for good, why the rest of the pipeline will not run.
CREATE TABLE pipeline_fanins (
    id         uuid        PRIMARY KEY,
    size       integer     NOT NULL,
    arrived    integer     NOT NULL DEFAULT 0,
    failed     text,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX pipeline_fanins_expires ON pipeline_fanins (expires_at);

-- Each member's result (the message encoder's bytes), by its place in the group: the next
-- step receives them in member order.
CREATE TABLE pipeline_fanin_results (
    fanin  uuid    NOT NULL REFERENCES pipeline_fanins (id) ON DELETE CASCADE,
    member integer NOT NULL,
    value  bytea   NOT NULL,
    PRIMARY KEY (fanin, member)
);
