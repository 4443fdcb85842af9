-- 057: a job of the log edited through the jobs view, or retried by an operator from
-- job_history, lives in the log afterwards (issue 38: one store).
--
-- Before, an UPDATE through the jobs view of a pending, retryable or waiting log job moved
-- it into job_queue (040/051's jobs_log_write), where jobs_view_write applied the write, and
-- it stayed there for good; an operator's retry of a job archived in job_history
-- (outcomes.RETRY_FAILED) wrote it into job_queue too. Now the job comes back into the log
-- once the write is applied: job_queue_to_log moves one live job_queue row (pending,
-- retryable or waiting, not running) that the log can take into job_log (due now) or
-- job_timers (due later, or retryable), with its keys. The writes keep their one place of
-- application (jobs_view_write); the job only passes through job_queue inside the
-- statement (one dead job_queue version per operator's edit: off every job's path).
--
-- What stays in job_queue: a running job edited through the view (it keeps its owner and
-- lease there, as before: its process's ack is fenced off by the done row jobs_log_write
-- wrote, and the row, reaped once the process lets go, runs again), and a row whose key the
-- log does not take (job_log_takes).

-- Whether the log takes a row with this limit key and limits: no key, or limits the log's
-- claim applies (055's flow_log_takes: the one rule, logstore.log_limits' in SQL).
CREATE FUNCTION job_log_takes(fk text, fl jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT fk IS NULL OR flow_log_takes(fl)
$$;

-- Move job i from job_queue into the log, if its row is live and not running and the log
-- takes it: due now (pending or waiting, run_at passed) into job_log, created at its run_at
-- (the log's due time, which the views and the start waits read), else into job_timers at
-- its run_at (a retryable one keeps its status, attempts and error). Its dedupe key stays
-- held (job_keys names the job by id, and job_key_live finds it in either store). A
-- concurrency_key written by hand beside a different limit key is job_queue's alone (046).
-- Returns whether it moved.
CREATE FUNCTION job_queue_to_log(i uuid) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    r job_queue;
BEGIN
    DELETE FROM job_queue q
     WHERE q.id = i AND q.status IN ('pending', 'retryable', 'waiting')
       AND (q.concurrency_key IS NULL OR q.concurrency_key = q.flow_key)
       AND job_log_takes(q.flow_key, q.flow)
    RETURNING * INTO r;
    IF r.id IS NULL THEN
        RETURN false;
    END IF;
    IF r.status = 'retryable' OR r.run_at > now() THEN
        INSERT INTO job_timers (id, queue, actor, args, kwargs, options, payload, priority, status, run_at, attempts,
                                max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at, last_error,
                                dedupe_key, flow_key, flow)
        VALUES (r.id, r.queue, r.actor, r.args, r.kwargs, r.options, r.payload, r.priority,
                CASE WHEN r.status = 'retryable' THEN 'retryable' ELSE 'pending' END, r.run_at, r.attempts,
                r.max_attempts, r.lease_losses, r.max_lease_losses, r.message_timestamp, r.created_at, r.last_error,
                r.dedupe_key, r.flow_key, r.flow);
    ELSE
        INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                             lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow)
        VALUES (r.id, r.queue, r.actor, r.args, r.kwargs, r.options, r.payload, r.priority, r.attempts,
                r.max_attempts, r.lease_losses, r.max_lease_losses, r.message_timestamp, r.run_at, r.dedupe_key,
                r.flow_key, r.flow);
    END IF;
    RETURN true;
END $$;

-- 051's jobs_log_write, all of it kept, with: the job it moves into job_queue named for the
-- trigger after jobs_view_write (a setting local to the transaction), which moves it back; a
-- parked job (the view's 'waiting') moved too (the write changed nothing before); a pending
-- job's keys kept (its dedupe key and limit key were lost in job_queue, and a slot it had
-- been handed waited for the sweep).
CREATE OR REPLACE FUNCTION jobs_log_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    l job_log;
    x job_lease;
    t job_timers;
BEGIN
    IF OLD.status IN ('pending', 'retryable', 'running', 'waiting') AND NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.id = OLD.id) THEN
        PERFORM pg_advisory_xact_lock(hashtext('job_log_claim'), hashtext(OLD.queue));
        DELETE FROM job_timers j WHERE j.id = OLD.id RETURNING * INTO t;
        IF t.id IS NOT NULL THEN
            INSERT INTO job_queue (id, queue, actor, args, kwargs, options, payload, status, priority, run_at, attempts,
                                   max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at, last_error,
                                   dedupe_key, flow_key, flow)
            VALUES (t.id, t.queue, t.actor, t.args, t.kwargs, t.options, t.payload,
                    CASE WHEN t.flow_key IS NOT NULL AND t.status = 'pending' THEN 'waiting' ELSE t.status END,
                    t.priority, t.run_at, t.attempts, t.max_attempts, t.lease_losses, t.max_lease_losses,
                    t.message_timestamp, t.created_at, t.last_error, t.dedupe_key, t.flow_key, t.flow);
            PERFORM set_config('supervisor.view_moved', t.id::text, true);
        ELSE
            FOR l IN SELECT * FROM job_log j WHERE j.id = OLD.id
                        AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = j.seq AND d.day = j.day) LOOP
                x := NULL;
                SELECT * INTO x FROM job_lease k WHERE l.seq = ANY(k.seqs) AND l.day = ANY(k.days) LIMIT 1;
                INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, claimed_at,
                                      last_error, flow_key, flow_slot)
                VALUES (l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'retried',
                        l.attempts + CASE WHEN x.batch IS NULL THEN 0 ELSE 1 END, x.owner, x.claimed_at,
                        'rewritten by a write through the jobs view',
                        -- (a pending job's key: the done row's trigger hands on a slot it was
                        -- handed and drops its parked entry; a running one keeps its slot
                        -- while its job_queue row lives, as before: the sweep frees it then)
                        CASE WHEN x.batch IS NULL THEN l.flow_key END, CASE WHEN x.batch IS NULL THEN l.flow_slot END)
                ON CONFLICT (seq, day) DO NOTHING;
                CONTINUE WHEN NOT FOUND;
                IF x.batch IS NULL THEN
                    INSERT INTO job_log_cancel (seq, day) VALUES (l.seq, l.day);
                END IF;
                -- (its keys with it, but a running one's limit key: job_queue's own slot
                -- accounting would count it twice)
                INSERT INTO job_queue (id, queue, actor, args, kwargs, options, payload, status, priority, run_at,
                                       attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at,
                                       lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key,
                                       flow_key, flow)
                VALUES (l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload,
                        CASE WHEN x.batch IS NOT NULL THEN 'running' WHEN l.flow_key IS NOT NULL THEN 'waiting'
                             ELSE 'pending' END, l.priority, l.created_at,
                        l.attempts + CASE WHEN x.batch IS NULL THEN 0 ELSE 1 END, l.max_attempts, x.owner, x.claimed_at,
                        x.renewed_at, x.expires_at, l.lease_losses, l.max_lease_losses, l.message_timestamp,
                        l.created_at, l.dedupe_key, CASE WHEN x.batch IS NULL THEN l.flow_key END,
                        CASE WHEN x.batch IS NULL THEN l.flow END);
                PERFORM set_config('supervisor.view_moved', l.id::text, true);
                EXIT;  -- a job has one live row
            END LOOP;
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

-- After jobs_view_write (triggers of a view fire in name order): the job jobs_log_write
-- moved out of the log for this write goes back, as the write left it.
CREATE FUNCTION jobs_write_back_to_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('supervisor.view_moved', true) = OLD.id::text THEN
        PERFORM set_config('supervisor.view_moved', '', true);
        PERFORM job_queue_to_log(NEW.id);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_write_back_to_log INSTEAD OF UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_write_back_to_log();
