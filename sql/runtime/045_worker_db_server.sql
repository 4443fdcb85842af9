-- The database server a process's connections reach (host:port, as its libpq reached it
-- with a multi-host URL), and after a change it saw (a failover), since when and the one
-- before: with its beat, so the Workers page, /api/v1/workers and `supervisor nodes`'s
-- readers see it for every host, not only through the local master (issue 42).
ALTER TABLE workers ADD COLUMN IF NOT EXISTS db_server text,
                    ADD COLUMN IF NOT EXISTS db_server_since timestamptz,
                    ADD COLUMN IF NOT EXISTS db_server_previous text;
