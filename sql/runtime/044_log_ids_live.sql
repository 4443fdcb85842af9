-- 044: the producer's check of a large batch as a function (job_ids_live), so the session
-- caches its plan: the same statement sent on its own was planned at every call (2-3 ms a
-- batch over job_queue and the log's partitions: a connection through PgBouncer prepares
-- nothing), as job_id_live (040, 041) already is for one message.

-- The ids of ``ids`` that a live job has: in job_queue, or in the log of yesterday to
-- tomorrow (UTC days) with no outcome. job_id_live for a whole batch, in one scan of each
-- index with every id (not a probe per row).
CREATE FUNCTION job_ids_live(ids uuid[]) RETURNS SETOF uuid LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
        SELECT q.id FROM job_queue q WHERE q.id = ANY(ids)
        UNION ALL
        SELECT l.id FROM job_log l
         WHERE l.id = ANY(ids) AND l.day BETWEEN job_log_today() - 1 AND job_log_today() + 1
           AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day);
END $$;
