"""Every CLI error is one line with a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from tests.conftest import cli

BAD_INPUT = [
    ("enqueue", "x", "--priority", "99999999999"),
    ("enqueue", "x", "--delay", "1e300"),
    ("enqueue", "x", "--delay", "nan"),
    ("enqueue", "x", "--args", "[NaN]"),
    ("enqueue", "x", "--kwargs", "[1]"),
    ("enqueue", "x", "--kwargs", '{"a": Infinity}'),
    ("enqueue", "x", "--max-retries", "99999999999"),
    ("enqueue", "x", "--rate-limit", "ten per minute"),
    ("enqueue", "x", "--rate-limit", "1/s", "--rate-limit-key", "{kwargs[a"),
    ("jobs", "retry", "not-a-uuid"),
    ("jobs", "cancel", "not-a-uuid"),
    ("jobs", "show", "not-a-uuid"),
    ("jobs", "list", "--limit", "99999999999"),
    ("scale", "alpha", "-1"),
    ("status",),
    ("run", "-c", "/nonexistent/supervisor.yaml"),
    ("worker", "--queues", "q", "--actors", "m", "--threads", "0"),
    ("worker", "--queues", "q", "--actors", "m", "--lease", "nan"),
    ("worker", "--queues", "q", "--actors", "no.such.module", "--no-migrate"),
    ("migrate", "--app", "no-such-app"),
    ("alerts", "resend", "not-a-number"),
]


@pytest.mark.parametrize("argv", BAD_INPUT, ids=" ".join)
def test_bad_input_is_one_line_and_a_nonzero_exit(argv, database_url, tmp_path):
    env = {"SUPERVISOR_CONFIG": "", "XDG_RUNTIME_DIR": str(tmp_path)}
    done = cli(*argv, env=env, timeout=60)
    assert done.returncode != 0, (argv, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith(("error:", "Error:")) or " ERROR [" in line]
    assert len(said) == 1, done.stderr


def test_a_retried_error_without_text_is_named_by_its_type(caplog):
    # "preparing the database failed ()" told an operator nothing.
    import logging

    from supervisor import backoff

    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError
        return "ready"

    with caplog.at_level(logging.WARNING, logger="supervisor.backoff"):
        assert backoff.retry(flaky, "preparing the database", first=0.01) == "ready"
    assert "preparing the database failed (TimeoutError)" in caplog.text
    assert backoff.describe(ValueError("  bad value ")) == "bad value"


def test_a_reader_that_goes_away_ends_the_command_quietly(conn, database_url):
    """`supervisor jobs list | head -1`: the pipe closes early; no error line, exit 0."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    conn.execute("INSERT INTO jobs (queue, actor) SELECT 'q', 'a' FROM generate_series(1, 3000)")
    cmd = f"{sys.executable} -m supervisor.cli jobs list --limit 3000 | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)},
                          timeout=60)
    assert done.stderr == "" and done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the one line head wanted


def test_a_database_nobody_migrated_says_to_migrate(fresh_database, tmp_path):
    env = {"SUPERVISOR_CONFIG": "", "XDG_RUNTIME_DIR": str(tmp_path)}
    for argv in (("queues",), ("limits",), ("jobs", "list")):
        done = cli(*argv, url=fresh_database, env=env, timeout=60)
        assert done.returncode == 4, (argv, done.stdout, done.stderr)  # exit_codes.DATABASE
        said = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(said) == 1 and "not migrated" in said[0] and "supervisor migrate" in said[0], done.stderr
