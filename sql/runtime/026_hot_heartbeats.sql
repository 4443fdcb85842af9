-- Heartbeats become HOT updates. A heartbeat changes only heartbeat_at and
-- lease_expires_at; with lease_expires_at indexed, every renewal of every running
-- job wrote a new entry into each of the table's indexes (and left a dead one for
-- vacuum). Without that index the renewal stays on its page (fillfactor 80 leaves
-- room) and touches no index. The reaper finds expired leases through
-- jobs_running_owner instead: it reads every running row, which is at most the
-- fleet's thread count, a few times per lease.
DROP INDEX IF EXISTS jobs_running_expiry;
