-- A failing watch (its page answers 404, cannot be parsed, or the source is down through
-- every retry) is still polled: last_polled_at is its last attempt, whatever the outcome
-- (the refactor plan's criterion: every watch shows it after the next cycle). last_ok_at
-- is its last successful poll (what a listing's absence and a scrape's freshness are
-- measured against); last_error the failure of the last attempt, NULL once one succeeds.
-- failures counts the failed polls in a row (one per scrape job, however many attempts
-- it made: failed_job); next_poll_at is when a failing watch is due again (its interval,
-- then doubling up to a day), NULL while it is not failing.
ALTER TABLE watches
    ADD COLUMN last_ok_at   timestamptz,
    ADD COLUMN last_error   text,
    ADD COLUMN failures     integer NOT NULL DEFAULT 0,
    ADD COLUMN failed_job   text,
    ADD COLUMN next_poll_at timestamptz;
UPDATE watches SET last_ok_at = last_polled_at;
