-- Delivery semantics (DESIGN §11): a lost lease (the process died, froze or was cut
-- off while running the job) is counted apart from exceptions. max_attempts is the
-- exception budget (max_retries + 1) and no longer a column default: a row inserted
-- by plain SQL leaves both budgets NULL and takes its actor's when a worker claims it.
ALTER TABLE jobs
    ADD COLUMN lease_losses     integer NOT NULL DEFAULT 0,
    ADD COLUMN max_lease_losses integer CHECK (max_lease_losses >= 1),
    ALTER COLUMN max_attempts DROP NOT NULL,
    ALTER COLUMN max_attempts DROP DEFAULT;

-- Cancelling a running job tells its process at once (it interrupts the job).
CREATE FUNCTION jobs_notify_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('actor_supervisor_cancel', NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_notify_cancel
    AFTER UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status = 'cancelled')
    EXECUTE FUNCTION jobs_notify_cancel();

-- An integer job option, or NULL when absent or not a number in [lo, hi]: the claim
-- reads budgets from options without letting one malformed row fail the statement
-- (that row is failed on its own by the worker).
CREATE FUNCTION jobs_option_int(options jsonb, key text, lo numeric, hi numeric) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(options) = 'object'
                 AND jsonb_typeof(options -> key) = 'number'
                 AND (options ->> key)::numeric BETWEEN lo AND hi
                THEN trunc((options ->> key)::numeric)::integer END
$$;
