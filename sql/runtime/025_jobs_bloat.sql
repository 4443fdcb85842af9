-- The jobs table stays small and fast (issue 9): settings for the vacuums of jobs.
--
-- Every status change is a non-HOT update (status is in the predicate of the partial
-- indexes), so each claimed row leaves a dead entry in jobs_claim that the next claims
-- step over until a vacuum removes it. Workers vacuum jobs themselves once enough dead
-- tuples wait (supervisor/worker/upkeep.py); these settings make autovacuum's visits
-- do the same work and keep both from stalling the claim.
ALTER TABLE jobs SET (
    -- Always clean the indexes. By default a vacuum skips them when under 2 % of the
    -- heap pages hold dead tuples, which is the usual case of a table that keeps
    -- millions of finished rows beside a steady stream: the claim index's dead entries
    -- would then stay until that 2 % is reached (tens of thousands of them).
    vacuum_index_cleanup = on,
    -- Never cut empty pages off the end of the table: that takes an ACCESS EXCLUSIVE
    -- lock, which stalls every claim (and, on a standby, cancels its queries). A queue
    -- that emptied fills again; its free pages are reused.
    vacuum_truncate = off
);
