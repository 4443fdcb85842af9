-- The jobs table churns: every job is inserted, updated two or three times (claim,
-- heartbeats, outcome) and deleted by retention. Each update leaves a dead tuple and,
-- since status and lease_expires_at are indexed (no HOT update), dead entries in the
-- claim index that every claim has to step over until a vacuum removes them.
--
-- So vacuum this table by row count, not by a fraction of it: with the default
-- scale factor (20 %) a table holding 2 M finished rows waits for 400,000 dead
-- tuples. And without the cost throttle: the table is hot and small once
-- retention runs, and a throttled vacuum falls behind a steady stream.
-- Finished rows leave the claim and running indexes with the update that finishes
-- them (those indexes are partial); this keeps their dead entries short-lived.
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0,
    -- room on each page for the new versions of its rows: a claim's or an ack's
    -- update lands on the page it read instead of a new one
    fillfactor = 80
);

-- One row per running concurrency key, inserted and deleted per job.
ALTER TABLE job_concurrency SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
