-- Every action over HTTP (the API's and the dashboard's): who (the token's name and
-- role), what (the action, its target, a bulk action's filter, other parameters), the
-- jobs it changed, and the answer (refusals too: 401, 403). Written by the HTTP child's
-- guard (supervisor/audit.py), pruned per retention.audit by the workers' upkeep.
CREATE TABLE audit_log (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    token_name text,                 -- NULL: no token (none sent, or none configured)
    role       text,
    action     text        NOT NULL, -- jobs.retry, queues.pause, ... (supervisor/http/roles.py)
    target     text,                 -- what it acted on: "job <id>", "queue q1", "role w"
    filter     jsonb,                -- a bulk action's filter
    detail     jsonb,                -- other parameters (a pause's reason, a scale's count)
    affected   integer,              -- jobs changed
    job_ids    uuid[],               -- which
    status     integer     NOT NULL, -- the HTTP status answered
    outcome    text,                 -- the answer's message, or why it was refused
    client     text                  -- the caller's address
);
-- Retention prunes by age.
CREATE INDEX audit_log_at ON audit_log (at);
