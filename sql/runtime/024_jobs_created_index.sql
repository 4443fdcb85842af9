-- The dashboard's job list (and the API's) pages newest first on (created_at, id):
-- this index makes every page, however deep, a short index range scan instead of a
-- sort of the whole table. created_at never changes, so updates stay HOT.
CREATE INDEX IF NOT EXISTS jobs_created_id ON jobs (created_at, id);
