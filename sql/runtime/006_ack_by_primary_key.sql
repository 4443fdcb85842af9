-- Acks and renewals look rows up by id (the heartbeat sends the ids it holds).
-- An index on lease_owner led the planner to scan every running row of the
-- owner, dead entries included, for each ack batch; releasing a dead process's
-- rows by owner scans the (small) set of running rows through jobs_running_expiry.
DROP INDEX IF EXISTS jobs_running_owner;
