"""The parts of the benchmarks that need nothing but the standard library and psycopg:
progress lines, figures and their table, a process's CPU from /proc, which code is
measured, and a throw-away database.

``floor_pgqueuer.py`` runs in a venv of its own (pgqueuer's), without this project
installed, so what it shares with the other benchmarks lives here; ``common.py``
re-exports it for them.
"""

from __future__ import annotations

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import contextlib
import os
import secrets
import statistics
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
TICK = os.sysconf("SC_CLK_TCK")


def say(line: str) -> None:
    """A progress line (stdout, flushed, so it shows while the run goes on)."""
    print(line, flush=True)


def code_state() -> str:
    """Which broker code is being measured: HEAD plus any uncommitted change
    under supervisor/ or sql/ (the repo is edited by several people at once)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "supervisor", "sql"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "code: unknown (no git)"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"code: {head or 'unknown'}" + (f" + uncommitted {', '.join(changed)}" if changed else " (clean)")


def with_dbname(url: str, name: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = name
    return make_conninfo(**params)


def server_url(explicit: str | None) -> str:
    return explicit or os.environ.get("DATABASE_URL") or DEFAULT_SERVER


@contextlib.contextmanager
def scratch_database(server: str, *, prefix: str) -> Iterator[str]:
    """Create an empty database on ``server``, yield its URL; drop it on the way out
    (also on Ctrl-C), so a run leaves nothing behind."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        say(f"bench database {name} dropped")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), 0 if it is gone."""
    return sum(cpu_split(pid)[:2])


def runq_seconds(pid: int) -> float:
    """Seconds the threads of a process spent runnable but waiting for a CPU (the
    scheduler's run-queue delay, /proc/PID/task/TID/schedstat's second field), 0 if gone."""
    try:
        return sum(int((task / "schedstat").read_text().split()[1])
                   for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def cpu_split(pid: int) -> tuple[float, float, int]:
    """(user seconds, system seconds, context switches) of a process, all its threads."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        switches = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                    switches += int(line.split()[1])
    except OSError:
        return 0.0, 0.0, 0
    return int(fields[11]) / TICK, int(fields[12]) / TICK, switches


@dataclass(frozen=True)
class Figure:
    """One measured quantity over repeated runs."""

    name: str
    unit: str
    values: tuple[float, ...]
    higher_is_better: bool = True
    target: float | None = None
    config: str = ""

    @property
    def best(self) -> float:
        return max(self.values) if self.higher_is_better else min(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def met(self) -> str:
        if self.target is None:
            return ""
        ok = self.best >= self.target if self.higher_is_better else self.best <= self.target
        return "yes" if ok else "NO"

    def row(self) -> list[str]:
        target = "" if self.target is None else f"{'>=' if self.higher_is_better else '<='} {_num(self.target)}"
        return [self.name, self.config, _num(self.best), _num(self.median),
                f"{_num(min(self.values))}..{_num(max(self.values))}", self.unit, target, self.met]


def _num(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def print_table(figures: list[Figure]) -> None:
    header = ["figure", "config", "best", "median", "spread", "unit", "target", "met"]
    rows = [header] + [f.row() for f in figures]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for n, r in enumerate(rows):
        say("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
        if n == 0:
            say("  ".join("-" * w for w in widths))
