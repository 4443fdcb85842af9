-- Concurrency slots are kept rows, taken and freed in place (issue 38: keyed jobs under a
-- pinned horizon). A slot was a row inserted at each claim and deleted at each job's end:
-- while a transaction held the xmin horizon, every job of a key left a dead version and an
-- index entry under (key, slot), and each claim's reads of its keys' slots (the count per
-- key, the free-slot search, the INSERT's uniqueness check) visited all of them (80 a key
-- after 4,000 jobs of 50 keys: a third of a keyed claim's buffers). Now a slot's row stays:
-- a claim sets job_id where it is NULL (sql/flow.py's take_slots: a free row locked FOR
-- UPDATE SKIP LOCKED, a missing one inserted), a job's end sets it back to NULL. Neither changes an indexed column, and
-- the pages keep room (fillfactor), so both are HOT updates: the versions a pin keeps
-- stay on the row's own page, one index entry for many of them. Rows freed a while ago
-- go with the upkeep (sql.PRUNE_SLOTS): a key that stops being used leaves nothing.
ALTER TABLE job_concurrency ALTER COLUMN job_id DROP NOT NULL;
ALTER TABLE job_concurrency ADD COLUMN freed_at timestamptz;
ALTER TABLE job_concurrency SET (fillfactor = 20);

CREATE OR REPLACE FUNCTION jobs_release_concurrency() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_concurrency SET job_id = NULL, freed_at = now()
     WHERE key = coalesce(OLD.flow_key, OLD.concurrency_key) AND job_id = OLD.id;
    IF FOUND AND OLD.flow_key IS NOT NULL THEN
        PERFORM pg_notify('actor_supervisor_jobs', '+' || OLD.queue);
    END IF;
    RETURN NULL;
END $$;
