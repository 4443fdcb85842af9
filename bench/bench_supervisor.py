"""Supervisor benchmark: reload scale-up time, kill-to-rerun time, memory.

    python bench/bench_supervisor.py [--database-url URL] [--repeat 5]

Figures (targets from the issue):
  S1 reload 2 -> 4 processes, until the new ones are ready   <= 1.5 s
     (measured twice: the master's work, seen over the control socket, and
     the `supervisor reload` command end to end, Python start-up included)
  S2 SIGKILL of a worker -> its jobs running again elsewhere  <= 1 s
  S3 master RSS; worker RSS (and USS: memory not shared with the master) <= 60 MB

It starts a real `supervisor run` on a throw-away database and measures; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, Figure, bench_database, print_table, say, server_url, wait_until
from supervisor import control

ROLE = "bench"


def write_config(path: Path, url: str, processes: int, socket: Path) -> None:
    data = {
        "database": {"url": url},
        "supervisor": {"control_socket": str(socket), "shutdown_timeout": "10s", "tick": "500ms",
                       "log_level": "WARNING"},
        "roles": {ROLE: {"processes": processes, "threads": 4, "queues": ["bench"], "actors": ["bench.bench_actors"],
                         "lease": "30s", "heartbeat": "5s", "shutdown_timeout": "5s"}},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    tmp.replace(path)


class Master:
    def __init__(self, config: Path, socket: Path, log: Path) -> None:
        self.config, self.socket = config, socket
        self._log = log.open("w")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", "-c", str(config)],
                                     cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def request(self, message: dict, timeout: float = 60) -> dict:
        reply = control.request(self.socket, message, timeout=timeout)
        if not reply.get("ok"):
            raise RuntimeError(reply)
        return reply

    def role(self) -> dict:
        return self.request({"cmd": "status"})["roles"][0]

    def settled(self, n: int) -> bool:
        try:
            r = self.role()
        except control.ControlError:
            return False
        procs = r["processes"]
        return len(procs) == n and all(p["ready"] and p["current"] and not p["stop_reason"] for p in procs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def bench_reload(m: Master, url: str, config: Path, repeat: int) -> tuple[Figure, Figure]:
    socket_times, cli_times = [], []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i in range(repeat):
        via_cli = i % 2 == 1
        write_config(config, url, 4, m.socket)
        started = time.monotonic()
        if via_cli:
            out = subprocess.run([sys.executable, "-m", "supervisor.cli", "reload", "-c", str(config)],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(out.stderr)
        else:
            m.request({"cmd": "reload"})
        took = time.monotonic() - started
        if not m.settled(4):
            raise RuntimeError("reload returned before the new processes were ready")
        (cli_times if via_cli else socket_times).append(took)
        say(f"  reload 2 -> 4 {'(supervisor reload command)' if via_cli else '(control socket)'}: {took:.3f}s")
        write_config(config, url, 2, m.socket)
        m.request({"cmd": "reload"})
    return (
        Figure("S1 reload 2->4 until ready (master)", "s", tuple(socket_times), higher_is_better=False, target=1.5,
               config="control socket"),
        Figure("S1 reload 2->4 until ready (CLI)", "s", tuple(cli_times), higher_is_better=False, target=1.5,
               config="`supervisor reload`"),
    )


def bench_kill(m: Master, url: str, repeat: int) -> Figure:
    times = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(repeat):
            wait_until(lambda: m.settled(3), 30, what="3 ready processes")
            conn.execute("TRUNCATE job_queue, job_history, job_events")
            # Four long jobs: one process claims them in one batch; the others stay free.
            conn.execute("INSERT INTO job_queue (queue, actor, kwargs, max_attempts) "
                         "SELECT 'bench', 'sleeper', '{\"seconds\": 3.0}', 5 FROM generate_series(1, 4)")
            wait_until(lambda: conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone()[0] == 4,
                       10, what="4 running jobs")
            owner, held = conn.execute(
                "SELECT lease_owner, array_agg(id) FROM jobs WHERE status = 'running' "
                "GROUP BY 1 ORDER BY count(*) DESC LIMIT 1").fetchone()
            pid = int(owner.split(":")[1])
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            def running_again(held=held, owner=owner) -> bool:
                return conn.execute(
                    "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'running' AND lease_owner <> %s",
                    (held, owner)).fetchone()[0] == len(held)

            wait_until(running_again, 10, interval=0.002, what="jobs running again")
            rerun = conn.execute("SELECT max(extract(epoch FROM claimed_at)) FROM jobs WHERE id = ANY(%s)",
                                 (held,)).fetchone()[0]
            took = float(rerun) - killed_at
            times.append(took)
            say(f"  SIGKILL -> {len(held)} job(s) running again elsewhere: {took:.3f}s")
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0] == 4, 30, what="jobs done")
    return Figure("S2 SIGKILL -> jobs running again", "s", tuple(times), higher_is_better=False, target=1.0,
                  config="3 procs x 4 threads")


def bench_memory(m: Master, url: str) -> list[Figure]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE job_queue, job_history, job_events")
        conn.execute("INSERT INTO job_queue (queue, actor, max_attempts) SELECT 'bench', 'noop', 1 "
                     "FROM generate_series(1, 3000)")
        wait_until(lambda: conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0] == 3000,
                   120, interval=0.05, what="3000 no-op jobs")
    master = psutil.Process(m.proc.pid)
    workers = [psutil.Process(p["pid"]) for p in m.role()["processes"]]
    rss = [w.memory_info().rss / 2**20 for w in workers]
    uss = [w.memory_full_info().uss / 2**20 for w in workers]
    say(f"  after 3000 jobs: master rss {master.memory_info().rss / 2**20:.1f}MB; "
        f"worker rss {', '.join(f'{r:.1f}' for r in rss)}MB; uss {', '.join(f'{u:.1f}' for u in uss)}MB")
    return [
        Figure("S3 master RSS", "MB", (master.memory_info().rss / 2**20,), higher_is_better=False),
        Figure("S3 worker RSS", "MB", tuple(rss), higher_is_better=False, target=60, config="4 threads, bench actors"),
        Figure("S3 worker USS (not shared)", "MB", tuple(uss), higher_is_better=False),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=None, help="server to create the throw-away database on")
    parser.add_argument("--repeat", type=int, default=6)
    args = parser.parse_args()
    if args.repeat < 2:
        parser.error("--repeat: at least 2 (the reloads alternate between the control socket and the CLI)")
    with bench_database(server_url(args.database_url), prefix="as_bench_sup") as url, \
            tempfile.TemporaryDirectory(prefix="as-sup-", dir="/tmp") as tmp:
        tmp_path = Path(tmp)
        config, socket = tmp_path / "s.yaml", tmp_path / "ctl.sock"
        write_config(config, url, 2, socket)
        started = time.monotonic()
        m = Master(config, socket, tmp_path / "master.log")
        try:
            wait_until(lambda: m.settled(2), 60, interval=0.01, what="master ready")
            say(f"  master start -> 2 ready processes: {time.monotonic() - started:.3f}s (Python start-up included)")
            figures = list(bench_reload(m, url, config, args.repeat))
            write_config(config, url, 3, socket)
            m.request({"cmd": "reload"})
            figures.append(bench_kill(m, url, args.repeat))
            figures += bench_memory(m, url)
        except BaseException:
            say((tmp_path / "master.log").read_text()[-3000:])
            raise
        finally:
            m.stop()
    say("")
    print_table(figures)


if __name__ == "__main__":
    main()
