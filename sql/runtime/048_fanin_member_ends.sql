-- 048: a pipeline group's member that ends failed or cancelled without its worker's
-- middleware (GroupSteps, broker/fanin.py) marks its fan-in failed all the same. Those ends
-- are written by SQL alone: a poison pill failed by the release statements (max_lease_losses:
-- sql.REAP_EXPIRED, RELEASE_DEAD, RELEASE_OWNER, RELEASE_NODE, joblog.LOG_RELEASE), an
-- operator's cancel (sql.CANCEL, joblog.LOG_CANCEL), Broker.flush (joblog.LOG_FLUSH;
-- sql.FLUSH_QUEUE deletes, so it calls pipeline_member_ended itself), a row that cannot
-- become a message (Leases.fail_unreadable) or one Dramatiq's AgeLimit skips (no after hook).
-- Without this the group waited for ever: its count never completes and nothing said why.
--
-- One rule, pipeline_member_ended, reached from where every end of a job is written rather
-- than from each statement: a trigger on the rows a finished job leaves (job_history for
-- job_queue's jobs, job_done for the log's). A job that succeeded pays nothing: job_history's
-- succeeded partition has no trigger, and job_done's fires only for a failed or cancelled
-- row (its WHEN is checked on the new row, no read). A failed or cancelled job_queue job pays
-- only its WHEN's test of its own options (a member carries pipe_fanin there); a failed or
-- cancelled log job one read of its log row by primary key, which the statement that ended it
-- has just read (job_done carries no options). A failure for good in the worker comes here too,
-- after GroupSteps wrote its own reason (with the exception): the first reason is kept.

-- Fail the fan-in of member ``place`` (a member's pipe_fanin option: id, index, size) of
-- job ``job`` (actor ``actor``) because ``why``. The fan-in row may not exist yet (it is
-- opened at the first arrival). A member whose result is in already (it ran, arrived and
-- was killed before its ack, then spent its budget) fails nothing: its group had what it
-- needed. Locked before that check, so an arrival committing meanwhile is seen. expires_at:
-- defaults.FANIN_TTL_MS (7 days), as GroupSteps' own writes.
CREATE FUNCTION pipeline_member_ended(place jsonb, job uuid, actor text, why text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    fid uuid := (place->>'id')::uuid;
BEGIN
    INSERT INTO pipeline_fanins (id, size, expires_at) VALUES (fid, (place->>'size')::int, now() + interval '7 days')
    ON CONFLICT (id) DO NOTHING;
    PERFORM 1 FROM pipeline_fanins WHERE id = fid FOR UPDATE;
    IF EXISTS (SELECT 1 FROM pipeline_fanin_results r WHERE r.fanin = fid AND r.member = (place->>'index')::int) THEN
        RETURN;
    END IF;
    UPDATE pipeline_fanins
       SET failed = coalesce(failed, format('member %s (%s, message %s) failed for good: %s',
                                            place->>'index', actor, job, why))
     WHERE id = fid;
END $$;

-- Why a job ended, in a fan-in's words, from its final status and last_error: the poison
-- pill's budget, an operator's cancel (or a flush of its queue), else the error's last line
-- (a traceback's is the exception).
CREATE FUNCTION pipeline_member_why(status text, last_error text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
SELECT CASE
    WHEN status = 'cancelled' AND last_error = 'flushed' THEN 'cancelled: its queue was flushed'
    WHEN status = 'cancelled' THEN 'cancelled by an operator'
    WHEN last_error LIKE 'poison pill:%' THEN 'failed by its lease-loss budget (' || last_error || ')'
    ELSE 'failed: ' || coalesce(substring(rtrim(last_error, E'\n') from '[^\n]*$'), 'no error recorded')
END
$$;

-- job_queue's jobs: every end archives the row into job_history (history.archive). Only on
-- the failed and cancelled partitions (cloned to their days as they are attached).
CREATE FUNCTION pipeline_member_archived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pipeline_member_ended(NEW.options->'pipe_fanin', NEW.id, NEW.actor,
                                  pipeline_member_why(NEW.status, NEW.last_error));
    RETURN NULL;
END $$;

CREATE TRIGGER pipeline_member_archived AFTER INSERT ON job_history_failed
    FOR EACH ROW WHEN (NEW.options ? 'pipe_fanin') EXECUTE FUNCTION pipeline_member_archived();
CREATE TRIGGER pipeline_member_archived AFTER INSERT ON job_history_cancelled
    FOR EACH ROW WHEN (NEW.options ? 'pipe_fanin') EXECUTE FUNCTION pipeline_member_archived();

-- The log's jobs: an attempt's end is its job_done row; the options are on its log row.
-- First the test alone, as EXISTS: 4 us a failed or cancelled row. The options read as a
-- value (a scalar subquery, or PERFORM ... FROM job_log) cost 38 us: its plan over job_log's
-- partitions was made again at each call (a custom plan, pruned when planned, priced below
-- the generic one), where EXISTS's generic plan is kept.
CREATE FUNCTION pipeline_member_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM job_log l WHERE l.seq = NEW.seq AND l.day = NEW.day AND l.options ? 'pipe_fanin') THEN
        PERFORM pipeline_member_ended(l.options->'pipe_fanin', NEW.id, NEW.actor,
                                      pipeline_member_why(NEW.status, NEW.last_error))
           FROM job_log l
          WHERE l.seq = NEW.seq AND l.day = NEW.day;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER pipeline_member_done AFTER INSERT ON job_done
    FOR EACH ROW WHEN (NEW.status IN ('failed', 'cancelled')) EXECUTE FUNCTION pipeline_member_done();
