"""The runtime without the app, on the command line: every runtime command works on a
database without the bundled tracker's tables, and an app's command where the app is not
in use says so in one line (exit 2) and changes nothing. In use: with a config, when a
role runs the app's actors or `apps:` names it; without one, when the database holds the
app's tables."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import main
from tests.conftest import emptied, scalar
from tests.http_helpers import runtime_config

NOT_IN_USE = "error: app actors is not in use"


def invoke(*args: str) -> tuple[int, str, str]:
    """In process (click's runner), for speed."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def ok(*args: str) -> str:
    code, out, err = invoke(*args)
    assert code == 0, f"{args}: {code}\n{out}\n{err}"
    return out


def refused(*args: str) -> str:
    code, out, err = invoke(*args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(NOT_IN_USE), f"{args}: {code}\n{out}\n{err}"
    return lines[0]


@pytest.fixture
def no_default_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no config/supervisor.yaml and no $SUPERVISOR_CONFIG."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SUPERVISOR_CONFIG", raising=False)
    return tmp_path


def test_every_runtime_command_works_without_the_app(runtime_database_url: str, tmp_path: Path) -> None:
    with emptied(runtime_database_url) as db:
        cfg = str(runtime_config(tmp_path / "sup.yaml", runtime_database_url))
        assert "database is up to date" in ok("migrate", "-c", cfg)
        assert ok("check", "-c", cfg)
        job = ok("enqueue", "noop", "--queue", "tests", "-c", cfg).strip()
        uuid.UUID(job)
        queues = json.loads(ok("queues", "--json", "-c", cfg))
        assert [(q["queue"], q["ready"]) for q in queues] == [("tests", 1)]
        ok("queues", "-c", cfg)
        ok("queues", "pause", "tests", "--reason", "deploy", "-c", cfg)
        ok("queues", "resume", "tests", "-c", cfg)
        assert [j["id"] for j in json.loads(ok("jobs", "list", "--json", "-c", cfg))] == [job]
        assert json.loads(ok("jobs", "show", job, "--json", "-c", cfg))["actor"] == "noop"
        ok("jobs", "cancel", job, "-c", cfg)
        ok("jobs", "retry", job, "-c", cfg)
        db.execute("INSERT INTO job_runs (job_name, scheduled_for, status) VALUES ('nightly', now(), 'succeeded')")
        assert "nightly" in ok("runs", "-c", cfg)
        assert "succeeded" in ok("history", "nightly", "-c", cfg)
        assert scalar(db, "SELECT to_regclass('sources') IS NULL")


def test_an_apps_command_where_the_config_does_not_use_it(runtime_database_url: str, database_url: str,
                                                         tmp_path: Path) -> None:
    runtime_db = str(runtime_config(tmp_path / "runtime.yaml", runtime_database_url))
    line = refused("sources", "list", "-c", runtime_db)
    assert "runtime.yaml" in line and "actors.*" in line and "apps:" in line
    refused("watches", "add", "--source", "shop", "--query", "ddr4", "-c", runtime_db)
    refused("tracker", "state", "--json", "-c", runtime_db)
    with emptied(runtime_database_url) as db:
        refused("alerts", "resend", "42", "-c", runtime_db)
        assert scalar(db, "SELECT count(*) FROM jobs") == 0  # nothing enqueued
        assert scalar(db, "SELECT to_regclass('sources') IS NULL")  # nothing migrated behind the user's back
    # The tables exist, and still the config decides.
    tracker_db = str(runtime_config(tmp_path / "other.yaml", database_url))
    refused("sources", "list", "-c", tracker_db)
    # A config that names the app uses it.
    named = tmp_path / "named.yaml"
    named.write_text(Path(tracker_db).read_text() + "apps: [actors]\n")
    ok("sources", "list", "-c", str(named))


def test_without_a_config_the_database_decides(runtime_database_url: str, database_url: str,
                                               no_default_config: Path) -> None:
    line = refused("--database-url", runtime_database_url, "tracker", "state")
    assert "supervisor migrate --app actors" in line
    with emptied(database_url):
        assert "watches" in ok("--database-url", database_url, "tracker", "state")


def test_the_help_lists_an_apps_commands_only_where_it_is_in_use(runtime_database_url: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def listed(*args: str) -> set[str]:
        out = ok(*args, "--help")
        return {line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()}

    cfg = str(runtime_config(tmp_path / "sup.yaml", runtime_database_url))
    shown = listed("-c", cfg)
    assert {"worker", "run", "jobs", "queues", "http", "migrate", "demo"} <= shown  # the demo brings its own
    assert not shown & {"sources", "watches", "alerts", "tracker"}
    monkeypatch.setenv("SUPERVISOR_CONFIG", cfg)
    assert "sources" not in listed()
    monkeypatch.setenv("SUPERVISOR_CONFIG", "config/supervisor.yaml")  # the repository's: the tracker's roles
    assert {"sources", "watches", "alerts", "tracker", "demo"} <= listed()


def test_a_reload_that_changes_the_apps_in_use_rolls_the_http_child(tmp_path: Path) -> None:
    """The HTTP child shows the apps its config uses: a reload that changes them rolls it."""
    from supervisor.config import load
    from supervisor.master.reload import diff

    def config(text: str):
        path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text("http: {listen: '127.0.0.1:9191'}\nroles:\n  w: {queues: [tests], actors: [tests.sample_actors]}\n"
                        + text)
        return load(path)

    own = config("")
    named = config("apps: [actors]\n")
    tracker = config("  s: {queues: [scraping], actors: [actors.scraping]}\n")
    assert diff(own, named).rolled["http"] == ["apps"]
    assert diff(own, tracker).rolled["http"] == ["apps"]
    assert "http" not in diff(named, tracker).rolled  # the same apps in use either way
