"""No password is ever printed or logged, whatever form the connection string takes."""

from __future__ import annotations

import json

import pytest
from psycopg.conninfo import conninfo_to_dict

from supervisor.db import redact
from tests.conftest import scalar, wait_for
from tests.supervisor_helpers import cli, role, write_config

SECRETS = ("Kv-S3cret!1", "Url-S3cret@2", "Query-S3cret3", "Env-S3cret4")


@pytest.mark.parametrize("text", [
    "postgresql://bob:Url-S3cret@2@db.example:5432/app?sslmode=require",
    "postgresql:///app?host=/run/pg&password=Query-S3cret3&user=bob",
    "host=/tmp user=bob password=Kv-S3cret!1 dbname=x",
    "host=/tmp password = 'Kv-S3cret!1 has spaces' dbname=x",
    "cannot connect to postgres://bob:Url-S3cret@2@h/d: timeout",
])
def test_redact_hides_every_form(text):
    out = redact(text)
    assert not any(s in out for s in SECRETS) and "***" in out, out


def test_redact_hides_pgpassword_from_the_environment(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "Env-S3cret4")
    assert redact("server said: password Env-S3cret4 rejected") == "server said: password *** rejected"


def test_no_output_surface_shows_a_password(tmp_path, conn, database_url, supervisor):
    """status, status --json, check and the master's and workers' logs, with the
    password in a key=value string, a URL and PGPASSWORD (trust auth ignores them)."""
    params = conninfo_to_dict(database_url)
    kv = f"{database_url} password=Kv-S3cret!1"
    as_url = f"postgresql://{params['user']}:Url-S3cret%402@/{params['dbname']}?host={params['host']}"
    query = f"postgresql:///{params['dbname']}?host={params['host']}&user={params['user']}&password=Query-S3cret3"
    env = {"PGPASSWORD": "Env-S3cret4"}
    path = write_config(tmp_path / "s.yaml", kv, {"alpha": role(processes=1, threads=1)})
    s = supervisor(path, env=env)
    s.wait_state({"alpha": 1})
    # make the worker log its connection: cut its sessions, it reconnects and says so
    # (once its LISTEN connection is open: cut before that, there is nothing to lose)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                  " AND query LIKE 'LISTEN %%'"), 20, message="the worker's LISTEN connection")
    # Only the supervisor's own sessions (application_name "actor-supervisor NODE:PID"): the
    # test process's pools share this database, and a later test would get their dead connections.
    ours = [str(pid) for pid in {s.pid, *s.pids()}]
    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                 " AND split_part(application_name, ':', 2) = ANY(%s)", (ours,))
    wait_for(lambda: "listener lost" in s.log() and "listener back" in s.log(), 20, message="the worker to reconnect")
    outputs = {"master and worker log": s.log()}
    for name, args in {"status": ("status",), "status --json": ("status", "--json"), "check": ("check",)}.items():
        done = cli(*args, config=path, env=env)
        outputs[name] = done.stdout + done.stderr
    assert json.loads(cli("status", "--json", config=path, env=env).stdout)["database"]
    for url in (as_url, query):
        done = cli("--database-url", url, "check", env=env)
        outputs[f"check {url[:30]}"] = done.stdout + done.stderr
        assert "reachable" in done.stdout
        bad = cli("--database-url", url.replace(params["dbname"], "no_such_db"), "check", env=env)
        outputs[f"check unreachable {url[:30]}"] = bad.stdout + bad.stderr
        assert bad.returncode != 0
    for name, text in outputs.items():
        assert "***" in text or name.startswith("status"), (name, text[-2000:])
        leaked = [s for s in SECRETS if s in text or s.replace("@", "%40") in text]
        assert not leaked, f"{name} shows {leaked}:\n{text[-3000:]}"
