-- A dead process is noticed by its beat, not its lease (supervisor/worker/liveness.py).
--
-- beat_seconds: the process's beat interval, set by a process that stops its own jobs
-- when its beats fail (see broker/leases.py), NULL for the others (masters, the HTTP
-- child, a process whose connections all go through a pooler): only those with it are
-- released by their beat.
-- session_name: the application_name of the process's own direct sessions; a process
-- that died has none left on the server (its kernel closed its sockets), a frozen one
-- keeps them.
-- server_started: pg_postmaster_start_time() of the server its last beat reached; a
-- restart or a failover ends every session without any process dying, so a process
-- whose last beat reached another server instance is left to its leases.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS beat_seconds real,
                    ADD COLUMN IF NOT EXISTS session_name text,
                    ADD COLUMN IF NOT EXISTS server_started timestamptz;
