"""Every script in bench/ still runs on today's code (issue 43): each answers ``--help``,
and each that can run small runs once at a tiny size against the test server, from
another working directory, and prints its figures. Sizes are far too small to mean
anything: this checks that a script runs, never what it measures (bench/README.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ROOT, _server_url

BENCH = ROOT / "bench"

# Modules the scripts import (bench.<name>): run as a script, each says so in one line.
HELPERS = ("async_actors", "basics", "bench_actors", "common", "dashboard_fill", "dashboard_reads", "floor",
           "limit_actors", "server_log", "workflow_split")
# Scripts that need a peer's packages, not ours: skipped where one is missing, else --help
# and a small run (its arguments and a line of its figures), as SMALL below.
PEERS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "floor_pgqueuer": (("pgqueuer",), "--jobs 300 --batch 32 --connections 1 --repeat 1", "backend CPU per job"),
    "w1_pgqueuer": (("pgqueuer", "asyncpg"), "--jobs 300 --repeat 1 --configs 1x16/8", "summary (1 runs each)"),
    "profiled_cli": (("yappi",), "", ""),  # the workers' entry point of profile_worker.py --profile
}
# Scripts run with --help only: what a test run has not, or a run too dear for it (the
# small run that passed, by hand, when this list was made).
HELP_ONLY = {
    "ab_trees": "runs profile_worker.py from two checkouts in turn",
    "dramatiq_suite": "runs Dramatiq's own test suite from a checkout of it",
    "soak_trace": "the workers' entry point of soak.py (python -m bench.soak_trace), run by soak.py's run below",
    # Their smallest runs cost 5-18 s of CPU each (worker processes started for each phase
    # of two alternated variants): all five would double this file's time, past its budget of
    # 60 s on 2 cores. bench_http, bench_progress and bench_mixed drive bench_broker's W1/W2
    # code, which runs below.
    "bench_http": "W1/W2 plain and observed: --jobs 300 --w1-threads 4 --w2-jobs 30 --repeat 1 --no-control",
    "bench_progress": "W1/W2 plain and with progress: --jobs 300 --w1-threads 4 --w2-jobs 30 --w2-threads 2 --repeat 1",
    "bench_mixed": "paced and fixed prefetch: --repeat 1 --rate 50 --seconds 1 --burst 100 --threads 2",
    "bench_delay": "D1 and D2: --jobs 20 --interval-ms 10",
    "bench_supervisor": "a supervisor run reloaded, killed and measured: --repeat 2",
    "failover": "builds a primary and a synchronous standby and fails over under load (tests/test_failover.py"
                " runs the same in the suite)",
}
# Each script that runs small: its arguments, and a line of its figures that must be printed;
# the longest first, so the last to start are short.
SMALL: dict[str, tuple[str, str]] = {
    "bench_limits": ("--keys 200 --l4-claims 25 --jobs 21 --backlog 100 --l2-jobs 100 --l2-repeat 1", "L1 rate used"),
    "bench_broker": ("--only W1,W2,W3 --jobs 300 --w2-jobs 30 --w3-jobs 64 --repeat 1 --w1-threads 4 --w2-threads 2",
                     "W3 % of ideal"),
    "claim_scale": ("--queued 1000 --finished 300 --empty-queued 50 --churn 200 --slices 1 --slice 100 --rounds 1"
                    " --per-round 2 --threads 2", "PRUNE_ROWS"),
    "soak": ("--minutes 0.05 --rate 100 --processes 1 --threads 2 --window 3 --retention 2 --warmup 1",
             "claim probe p99"),
    "pressure": ("--mode both --rate 100 --baseline 1 --pin 1 --after 1 --settle 0.5 --interval 1 --threads 2"
                 " --reader-xact 1", "throughput under pin+readers"),
    "floor_shapes": ("--jobs 300 --batch 32 --rounds 1", "today's (medians)"),
    "dashboard_bounds": ("--rows 2000 --live 50", "statements read more than"),
    "claim_days": ("--days 2 --rounds 1 --batches 5 --batch 20", "backend CPU with 2 past days"),
    "bench_enqueue": ("--jobs 300 --repeat 1", "COPY"),
    "rss": ("--jobs 200", "worker RSS"),
    "dashboard_scale": ("--rows 2000 --live 100 --runs 1", "caps: error_groups.SCAN_CAP"),
    "profile_worker": ("--jobs 300 --threads 2 --repeat 1", "median backend CPU us/job"),
    "connections": ("--jobs 300 --processes 1 --threads 2", "host: peak"),
    "job_path": ("--jobs 300 --repeat 1", "medians, us of CPU per job"),
    "async_jobs": ("--jobs 50 --seconds 0.2 --threads 2 --limits 50 --runs 1", "most at once"),
    "pin_statements": ("--jobs keyed --rate 200 --batch 20 --before 1 --pin 1 --window 1 --vacuum 1", "shared hit"),
    "claim_priorities": ("--delayed 0,100 --runs 5", "claim of 32, pooled"),
    "db_floor": ("--jobs 300 --batch 32 --connections 1 --repeat 1", "backend CPU per job"),
    "live_scale": ("--finished 2000 --running 4 --runs 1", "live rows of a queue"),
    "stub_worker": ("--jobs 300 --threads 2 --repeat 1", "us CPU per job"),
    "span_cost": ("--spans 200 --rounds 1", "best of 1 rounds"),
    # our side only here (pgqueuer runs in a venv of its own, given by --pgqueuer-python)
    "bulk_vs_pgqueuer": ("--jobs 300 --batch 100 --repeat 1 --pgqueuer-python /nonexistent/python",
                         "jobs in calls of 100"),
    "bulk_interleaved": ("--rounds 1 --calls 1 --pgqueuer-python /nonexistent/python", "rounds of 1 calls"),
    "cron_next": ("--rounds 1 --n 50", "us per next fire time"),
    "bench_groups": ("--ops 50 --members 20 --repeat 1", "G1 last member -> callback"),
    "bench_workflows": ("--steps 50 --repeat 1", "J1 p50"),
    "trigger_cost": ("--rows 2000 --batch 100 --rounds 1 --statements 200", "one-row statements of a plain success"),
}
ENTRY = sorted(set(SMALL) | set(HELP_ONLY))
# The small runs mostly wait (a worker's start, a phase's seconds, the server's checkpoint
# at each DROP DATABASE), so a few run at once, in one test: xdist cannot be asked to keep
# tests together here (its loadgroup does not group under pytest 9), and one test per
# script would run them one at a time in each test process.
AT_ONCE = 4
RUN_TIMEOUT = 300.0

# Runs each script given on its command line as `python bench/<script>.py --help` would,
# in one interpreter (each fresh one would import the runtime again: a third of this
# file's time): sys.path as a script run by path has it (its own directory first, the
# checkout not on it) and no bench module left from the last one, so a script that does
# not find its own imports fails here as it would alone. Prints {script: [exit code, output]}.
HELP_RUNNER = """
import contextlib, io, json, runpy, sys
base = [p for p in sys.path[1:] if p not in ("", ROOT)]
out = {}
for path in sys.argv[1:]:
    for name in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
        del sys.modules[name]
    sys.path[:] = [path.rsplit("/", 1)[0], *base]
    sys.argv = [path, "--help"]
    text = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:
            code, _ = 1, text.write(f"{type(e).__name__}: {e}")
    out[path] = [code, text.getvalue()]
print(json.dumps(out))
"""


def script_env() -> dict[str, str]:
    """The test server as DATABASE_URL (each script makes its own databases on it); no
    PYTHONPATH: a script finds its checkout itself."""
    env = {**os.environ, "DATABASE_URL": _server_url()}
    env.pop("PYTHONPATH", None)
    return env


def run_script(script: str, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python bench/<script>.py ARGS`` from ``cwd``. On a timeout the script gets a Ctrl-C
    (its own cleanup stops its workers and drops its databases; signalled with it, the
    workers died first and the databases stayed), then its process group a SIGKILL."""
    command = [sys.executable, str(BENCH / f"{script}.py"), *args]
    proc = subprocess.Popen(command, cwd=cwd, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        err += f"\n(ended after {timeout:.0f} s)"
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def test_every_script_is_listed() -> None:
    """A new file in bench/ is a helper, a peer's, help-only or run small: this test says which."""
    listed = set(HELPERS) | set(PEERS) | set(HELP_ONLY) | set(SMALL)
    present = {p.stem for p in BENCH.glob("*.py")} - {"__init__"}
    assert present == listed, f"unlisted: {sorted(present - listed)}; gone: {sorted(listed - present)}"


def test_every_script_answers_help(tmp_path: Path) -> None:
    runner = HELP_RUNNER.replace("ROOT", repr(str(ROOT)))
    out = subprocess.run([sys.executable, "-c", runner, *(str(BENCH / f"{s}.py") for s in ENTRY)], cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    failed = {Path(p).name: text[-600:] for p, (code, text) in results.items() if code != 0 or "usage:" not in text.lower()}
    assert not failed, failed
    assert len(results) == len(ENTRY)


@pytest.mark.parametrize("module", HELPERS)
def test_a_helper_says_it_is_not_a_script(module: str, tmp_path: Path) -> None:
    out = run_script(module, ["--help"], tmp_path, timeout=30)
    assert out.returncode == 1
    assert out.stderr.strip() == f"{BENCH / module}.py: a module the scripts in bench/ import, not a script" \
                                 " (bench/README.md lists them)"


@pytest.mark.parametrize("script", sorted(PEERS))
def test_a_peer_script_runs(script: str, tmp_path: Path) -> None:
    packages, args, figure = PEERS[script]
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"bench/{script}.py needs {' and '.join(missing)} (a peer's), not installed here")
    out = run_script(script, ["--help"], tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout.lower()
    if args:
        out = run_script(script, args.split(), tmp_path, timeout=RUN_TIMEOUT)
        assert out.returncode == 0, f"{out.stdout[-1500:]}\n{out.stderr[-2500:]}"
        assert figure in out.stdout + out.stderr, out.stdout[-1500:]


def test_every_script_runs_small(tmp_path_factory: pytest.TempPathFactory) -> None:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = {script: pool.submit(run_script, script, args.split(), tmp_path_factory.mktemp(script), RUN_TIMEOUT)
                for script, (args, _) in SMALL.items()}
    failed = {}
    for script, run in runs.items():
        out = run.result()
        if out.returncode != 0 or SMALL[script][1] not in out.stdout + out.stderr:
            failed[script] = (f"python bench/{script}.py {SMALL[script][0]}: exit {out.returncode},"
                              f" expected {SMALL[script][1]!r}\n{out.stdout[-1500:]}\n{out.stderr[-2500:]}")
    assert not failed, "\n\n".join(failed.values())
