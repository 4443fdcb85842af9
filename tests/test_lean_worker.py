"""A worker imports what its role needs: no HTTP stack, no dashboard, no app code of
roles it does not run, no YAML readers (standalone). Real worker processes report
their own sys.modules through a job."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import cli, scalar, wait_for
from tests.supervisor_helpers import role, write_config

# Never in a worker process: the HTTP child's stack and the dashboard.
HTTP_STACK = ("starlette", "uvicorn", "jinja2", "httpx", "supervisor.http")


def _modules_of_a_job(conn, tmp_path: Path, queue: str = "lean") -> set[str]:
    out = tmp_path / f"modules-{queue}.txt"
    job = scalar(conn, "INSERT INTO jobs (queue, actor, max_attempts, args) VALUES (%s, 'record_modules', 1, "
                 "jsonb_build_array(%s::text)) RETURNING id::text", (queue, str(out)))
    wait_for(lambda: scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "succeeded", 30,
             message="the record_modules job")
    return set(out.read_text().split())


def _loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def test_a_worker_process_imports_no_http_stack_no_app_and_no_yaml(conn, workers, tmp_path):
    w = workers(queues="lean", actors="tests.lean_actors", threads=2)
    w.wait_ready(conn)
    modules = _modules_of_a_job(conn, tmp_path)
    assert "tests.lean_actors" in modules and "supervisor.worker.process" in modules  # it is the worker
    assert _loaded(modules, HTTP_STACK) == []
    # Nor what other commands, the master or the installed app need.
    unneeded = ("prometheus_client", "yaml", "supervisor.admin", "supervisor.master", "supervisor.config.sections",
                "supervisor.cli.jobs", "supervisor.cli.control_cmds", "actors.cli", "actors.config", "actors.tracker")
    assert _loaded(modules, unneeded) == []


def test_a_role_worker_forked_by_the_master_imports_no_http_stack(conn, supervisor, tmp_path, database_url):
    config = write_config(tmp_path / "supervisor.yaml", database_url,
                          {"lean": role(processes=1, threads=2, queues=("lean",), actors=("tests.lean_actors",))})
    s = supervisor(config)
    s.wait_state({"lean": 1})
    modules = _modules_of_a_job(conn, tmp_path)
    assert "supervisor.master.arbiter" in modules  # forked: it has the master's modules
    assert _loaded(modules, HTTP_STACK) == []
    assert _loaded(modules, ("supervisor.admin", "actors.cli", "actors.tracker")) == []


def test_the_cli_still_lists_and_runs_runtime_and_app_commands(database_url):
    shown = cli("--help", url=database_url)
    assert shown.returncode == 0, shown.stderr
    listed = {line.split()[0] for line in shown.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert {"worker", "run", "jobs", "queues", "http", "migrate"} <= listed  # the runtime's
    assert {"tracker", "sources"} <= listed  # the bundled app's, through its entry point
    listing = cli("queues", "--json", url=database_url)
    assert listing.returncode == 0, listing.stderr
    unknown = cli("no-such-command", url=database_url)
    assert unknown.returncode == 2 and "No such command" in unknown.stderr


def test_the_registry_samples_rss_and_cpu_as_psutil_does():
    """Workers report RSS and CPU from /proc and os.times() (no psutil import): the
    same numbers psutil gives for this process."""
    import os

    import psutil

    from supervisor.registry import SelfUsage

    usage, proc = SelfUsage(), psutil.Process()
    proc.cpu_percent(None)
    spent = os.times()
    while sum(os.times()[:2]) - sum(spent[:2]) < 0.2:  # burn 0.2 s of CPU (measured, not slept)
        pass
    ours, theirs = usage.cpu_percent(), proc.cpu_percent(None)
    # Above 100 % when another thread of this test process (a pool's, say) ran meanwhile.
    assert 0 < ours <= 100 * (os.cpu_count() or 1) + 5
    assert abs(ours - theirs) <= 15  # same interval, same formula
    assert abs(usage.rss() - proc.memory_info().rss) <= 2 << 20
