-- Progress reports keep their kind (supervisor.progress(..., event=...)) and are no
-- longer merged away per write interval (up to broker/progress.py's MAX_REPORTS per
-- job per interval). NULL: a plain report.
ALTER TABLE job_progress ADD COLUMN event text;
