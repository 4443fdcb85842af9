"""Every statement on ``workflows`` and ``workflow_steps`` (migration 049): a workflow written
at send, its step's result before its ack (job_queue's steps), the operator's reads, cancels
and retries. Releasing children is the migration's SQL (workflow_steps_ended), fired where a
job's outcome is written. Every path that changes a workflow's steps takes its workflow's
row first (LOCK), as the triggers do: two writers of one workflow queue, never deadlock."""

# A workflow's row, at send.
INSERT_WORKFLOW = """
INSERT INTO workflows (id, name, policy, steps) VALUES (%(id)s, %(name)s, %(policy)s, %(steps)s)
"""

# Its steps, one array per column (roots 'enqueued': the producer writes their jobs in the
# same transaction; the rest 'blocked').
STEP_COLUMNS = ("id, workflow, position, parents, children, remaining, state, to_log, queue, actor, args, kwargs,"
                " options, priority, max_attempts, max_lease_losses, dedupe_key, concurrency_key,"
                " message_timestamp, flow_key, flow, enqueued_at")
INSERT_STEPS = f"""
INSERT INTO workflow_steps ({STEP_COLUMNS})
SELECT m.id, m.workflow, m.position, m.parents::uuid[], m.children::uuid[], m.remaining, m.state, m.to_log, m.queue,
       m.actor, m.args, m.kwargs, m.options, m.priority, m.max_attempts, m.max_lease_losses, m.dedupe_key,
       m.concurrency_key, m.message_timestamp, m.flow_key, m.flow, CASE WHEN m.state = 'enqueued' THEN now() END
  FROM unnest(%(id)s::uuid[], %(workflow)s::uuid[], %(position)s::int[], %(parents)s::text[], %(children)s::text[],
              %(remaining)s::int[], %(state)s::text[], %(to_log)s::bool[], %(queue)s::text[], %(actor)s::text[],
              %(args)s::jsonb[], %(kwargs)s::jsonb[], %(options)s::jsonb[], %(priority)s::int[],
              %(max_attempts)s::int[], %(max_lease_losses)s::int[], %(dedupe_key)s::text[],
              %(concurrency_key)s::text[], %(message_timestamp)s::bigint[], %(flow_key)s::text[],
              %(flow)s::jsonb[])
       AS m(id, workflow, position, parents, children, remaining, state, to_log, queue, actor, args, kwargs, options,
            priority, max_attempts, max_lease_losses, dedupe_key, concurrency_key, message_timestamp, flow_key, flow)
"""
# (parents and children go as text: a uuid[] per row is an array of arrays, which unnest
# would flatten; their text form '{a,b}' is cast per row by the column's type.)

# A job_queue step's result, before its ack (the log's rides on its done row): the ack's
# archive copies it into job_history, where the end trigger reads it.
STEP_RESULT = "UPDATE job_queue SET result = %(result)s WHERE id = %(id)s"

# The workflow's row, locked for the operator's change (the triggers lock it the same way).
LOCK = "SELECT id, policy, state FROM workflows WHERE id = %(id)s FOR NO KEY UPDATE"

STEP_OF = "SELECT workflow FROM workflow_steps WHERE id = %(step)s"

# Cancel: every step not ended (all), or a step and its descendants; the running ones come
# back, marked cancelled here, their jobs cancelled after the commit (admin.cancel_job).
CANCEL_TARGETS = """
SELECT coalesce(array_agg(id), '{}') FROM workflow_steps
 WHERE workflow = %(id)s AND state IN ('blocked', 'enqueued')
   AND (%(step)s::uuid IS NULL OR id = %(step)s::uuid OR id = ANY(workflow_descendants(ARRAY[%(step)s::uuid])))
"""
CANCEL_STEPS = "SELECT workflow_cancel_steps(%(ids)s::uuid[], %(why)s, %(who)s)"
MARK_CANCELLED = """
UPDATE workflow_steps SET state = 'cancelled', reason = %(why)s, finished_at = now(), result = NULL
 WHERE id = ANY(%(ids)s::uuid[]) AND state = 'enqueued'
"""
SET_REASON = "UPDATE workflows SET reason = coalesce(reason, %(why)s) WHERE id = %(id)s"

# Retry: the failed and cancelled steps and their descendants (all), or a step and its
# descendants; only ended ones (a blocked step waits already, an enqueued one runs). Each goes
# back to blocked with its count of parents not succeeded; those at 0 are released at once.
RETRY_TARGETS = """
WITH t AS (
    SELECT id FROM workflow_steps
     WHERE workflow = %(id)s AND (CASE WHEN %(step)s::uuid IS NULL THEN state IN ('failed', 'cancelled')
                                       ELSE id = %(step)s::uuid END)
)
SELECT coalesce(array_agg(s.id), '{}') FROM workflow_steps s
 WHERE s.workflow = %(id)s AND s.state IN ('succeeded', 'failed', 'cancelled')
   AND (s.id IN (SELECT id FROM t) OR s.id = ANY(workflow_descendants(ARRAY(SELECT id FROM t))))
"""
RESET = """
UPDATE workflow_steps SET state = 'blocked', result = NULL, reason = NULL, finished_at = NULL, enqueued_at = NULL
 WHERE id = ANY(%(ids)s::uuid[])
"""
RECOUNT = """
UPDATE workflow_steps s
   SET remaining = (SELECT count(*) FROM unnest(s.parents) AS p(id) JOIN workflow_steps ps ON ps.id = p.id
                     WHERE ps.state <> 'succeeded')
 WHERE s.id = ANY(%(ids)s::uuid[])
"""
RELEASE = "SELECT workflow_release(%(ids)s::uuid[])"
CLEAR_REASON = "UPDATE workflows SET reason = NULL WHERE id = %(id)s"

# --- reads (the API, the CLI, the metrics) -----------------------------------------------

_WORKFLOW_FIELDS = """w.id::text, w.name, w.policy, w.state, w.steps, w.succeeded, w.failed, w.cancelled,
       w.steps - w.succeeded - w.failed - w.cancelled AS open, w.reason, w.created_at, w.finished_at"""

# A page of workflows, newest first, from (created_at, id) before a cursor.
LIST = f"""
SELECT {_WORKFLOW_FIELDS}
  FROM workflows w
 WHERE (%(state)s::text IS NULL OR w.state = %(state)s)
   AND (%(before_at)s::timestamptz IS NULL OR (w.created_at, w.id) < (%(before_at)s, %(before_id)s::uuid))
 ORDER BY w.created_at DESC, w.id DESC
 LIMIT %(limit)s
"""

GET = f"SELECT {_WORKFLOW_FIELDS} FROM workflows w WHERE w.id = %(id)s"

# Its steps in the order added: state, edges, the job (its id is the step's), timings.
STEPS = """
SELECT s.id::text, s.position, s.actor, s.queue, s.state, s.parents::text[] AS parents,
       s.children::text[] AS children, s.remaining, s.result, s.reason, s.enqueued_at, s.finished_at,
       s.id::text AS job_id
  FROM workflow_steps s WHERE s.workflow = %(id)s ORDER BY s.position
"""

# How many workflows are in each state (the metrics' gauge).
BY_STATE = "SELECT state, count(*) FROM workflows GROUP BY state"

# Which workflow a job belongs to (the job page and the jobs search).
OF_JOB = "SELECT workflow::text FROM workflow_steps WHERE id = %(id)s"

# A workflow's results by step (Workflow.results).
RESULTS = "SELECT id::text, state, result FROM workflow_steps WHERE workflow = %(id)s ORDER BY position"

STATE = "SELECT state FROM workflows WHERE id = %(id)s"

CHANNEL = "actor_supervisor_workflows"

# --- the dashboard's reads (http/dashboard/workflows_page.py) ------------------------------

# A workflow's graph: each step's edges to its parents and its state, the start of its
# arguments (to tell steps of one actor apart), no result (it may be large; its job's page
# shows it). At most %(limit)s steps, in the
# order added, by the (workflow, position) index: the page draws a bounded part of them.
GRAPH = """
SELECT s.id::text, s.position, s.actor, left(s.args::text, 60) AS args, s.state, s.parents::text[] AS parents,
       s.reason, s.enqueued_at
  FROM workflow_steps s WHERE s.workflow = %(id)s ORDER BY s.position LIMIT %(limit)s
"""

# Which of the given steps' jobs run now (an enqueued step is waiting or running): a probe
# of each job by id, for the steps the page draws only.
RUNNING = "SELECT id::text FROM jobs WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running'"
