-- Every failed attempt keeps its error group: the Errors page, GET /api/v1/errors and
-- `supervisor errors` group failures and retries by actor, exception type and the
-- innermost frame of the actor's own code.
--
-- A retried attempt's traceback lives only in jobs.last_error until the next attempt
-- overwrites it, so the group is recorded where each failed attempt already writes a
-- row: its job_events row (a retry, a failure, a row that could not be read, a lost
-- lease), in the same statement. The worker parses the traceback it stores
-- (broker/error_key.py); the runtime's own failures (a lost lease, a poison pill, an
-- unreadable row) are named in SQL. error_where is '' when there is no frame, never
-- NULL, so a group is an equality on three columns an index can serve.
-- Events written before this migration have no group and are not shown.
ALTER TABLE job_events
    ADD COLUMN actor       text,
    ADD COLUMN error_type  text,
    ADD COLUMN error_where text;

-- The failed attempts of a time window, newest first, with what grouping and the
-- retry/failure split read: an index-only scan of the window, never of all events.
CREATE INDEX job_events_errors ON job_events (at) INCLUDE (actor, error_type, error_where, to_status, job_id)
    WHERE error_type IS NOT NULL;

-- One group's attempts by time: its first sighting (one descent), its sample, and the
-- jobs an action on the group changes.
CREATE INDEX job_events_error_groups ON job_events (actor, error_type, error_where, at) INCLUDE (job_id)
    WHERE error_type IS NOT NULL;
