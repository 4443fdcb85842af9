"""W1 and W2 with and without observation: the job metrics middleware on (workers
write prometheus_client multiprocess files) and `supervisor http` scraped at
/metrics every second, against the plain run. Prints both and the difference.

Runs alternate (plain, observed, plain again, plain, observed, ...) so a change in
the shared machine's load hits both alike. "plain again" is a control: a second
plain run in each round, so "plain again vs plain" shows how far two identical
runs differ here (noise), next to "observed vs plain". Each observed run also
reports its scrapes: how many, and their p50/max latency.

    python bench/bench_http.py                    # W1 20,000 jobs x 16 threads, W2 1,000 sends; 3 runs each
    python bench/bench_http.py --only W2 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_broker import w1, w2
from bench.common import ROOT, Figure, bench_database, code_state, percentile, print_table, say, server_url

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Scraper(threading.Thread):
    """GET /metrics every ``interval`` seconds until stopped; keeps each scrape's latency."""

    def __init__(self, base: str, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.interval = interval
        self.ms: list[float] = []
        self.errors = 0
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            while not self.halt.wait(self.interval):
                t = time.monotonic()
                try:
                    r = client.get("/metrics")
                    r.raise_for_status()
                except httpx.HTTPError:
                    self.errors += 1
                    continue
                self.ms.append((time.monotonic() - t) * 1000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def observed(url: str):
    """A metrics directory for the workers, `supervisor http` reading it, and a scraper."""
    with tempfile.TemporaryDirectory(prefix="as-bench-metrics-") as metrics_dir:
        port = _free_port()
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT), METRICS_DIR_ENV: metrics_dir}
        server = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "http", "--listen", f"127.0.0.1:{port}"],
                                  cwd=Path(tempfile.gettempdir()), env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/healthz", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("supervisor http did not start") from None
                time.sleep(0.05)
        scraper = Scraper(base)
        scraper.start()
        try:
            yield {"env": {METRICS_DIR_ENV: metrics_dir}}, scraper
        finally:
            scraper.halt.set()
            scraper.join(15)
            server.terminate()
            server.wait(15)
            ms = scraper.ms or [0.0]
            say(f"    scrapes: {len(scraper.ms)} ok, {scraper.errors} failed; "
                f"p50 {percentile(ms, 50):.1f} ms, max {max(ms):.1f} ms")


def middleware_cost(n: int = 20_000) -> float:
    """Microseconds JobMetrics adds per job (before + after process_message), measured in a
    child process with its own multiprocess directory: the direct cost on a worker thread."""
    code = f"""
import os, sys, tempfile, time, types
os.environ["{METRICS_DIR_ENV}"] = tempfile.mkdtemp()
sys.path.insert(0, {str(ROOT)!r})
from supervisor.worker.metrics import JobMetrics
m = JobMetrics()
msgs = [types.SimpleNamespace(queue_name="bench", actor_name="noop", message_id=str(i), options={{}})
        for i in range({n})]
t = time.perf_counter()
for msg in msgs:
    m.before_process_message(None, msg)
    m.after_process_message(None, msg)
print((time.perf_counter() - t) / {n} * 1e6)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


@contextmanager
def plain(url: str):
    yield {}, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="W1,W2")
    p.add_argument("--jobs", type=int, default=20_000, help="W1 job count")
    p.add_argument("--w1-threads", type=int, default=16)
    p.add_argument("--w2-jobs", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--database-url", default=None)
    p.add_argument("--no-control", action="store_true", help="skip the second plain run of each round")
    args = p.parse_args(argv)
    only = {w.strip().upper() for w in args.only.split(",") if w.strip()}
    results: dict[tuple[str, str], list[float]] = {}
    with bench_database(server_url(args.database_url)) as url:
        import supervisor

        broker = supervisor.setup_broker(url)
        from bench import bench_actors as actors

        say(code_state())
        costs = [middleware_cost() for _ in range(args.repeat)]
        say(f"JobMetrics per job (before + after process_message): {min(costs):.1f} us best, "
            f"{sorted(costs)[len(costs) // 2]:.1f} us median")
        results[("metrics middleware per job", "observed")] = costs
        for run in range(args.repeat):
            modes = [("plain", plain), ("observed", observed)] + ([] if args.no_control else [("plain again", plain)])
            for mode, setup in modes:
                if "W1" in only:
                    say(f"W1 {mode} run {run + 1}/{args.repeat}: {args.jobs:,} no-op jobs, "
                        f"2 processes x {args.w1_threads} threads")
                    with setup(url) as (pool, _):
                        r = w1(url, broker, actors, jobs=args.jobs, threads=args.w1_threads, chunk=0,
                               pool={"prefetch": args.w1_threads, **pool})
                    results.setdefault(("W1 drain", mode), []).append(r["drain"])
                if "W2" in only:
                    say(f"W2 {mode} run {run + 1}/{args.repeat}: {args.w2_jobs:,} sends 10 ms apart")
                    with setup(url) as (pool, _):
                        r2 = w2(url, actors, jobs=args.w2_jobs, threads=8, interval=0.01, pool=pool)
                    results.setdefault(("W2 send->start p50", mode), []).append(percentile(r2["start"], 50))
                    results.setdefault(("W2 send->start p99", mode), []).append(percentile(r2["start"], 99))
    figures = []
    for (name, mode), values in results.items():
        unit = "jobs/s" if name.startswith("W1") else ("us" if name.startswith("metrics") else "ms")
        figures.append(Figure(name, unit, tuple(values), higher_is_better=unit == "jobs/s", config=mode))
    print_table(figures)
    for name in dict.fromkeys(n for n, mode in results if mode == "plain"):
        a = Figure(name, "", tuple(results[(name, "plain")]))
        for other in ("observed", "plain again"):
            if (name, other) in results:
                b = Figure(name, "", tuple(results[(name, other)]))
                say(f"{name}: {other} median vs plain median {(b.median - a.median) / a.median:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
