"""Before/after on a shared machine: run bench/profile_worker.py from two (or
more) checkouts in turn, A B A B ..., and print each one's medians with the
load average of its runs.

    python bench/ab_trees.py --trees /work/wt/base,/work/wt/new [--rounds 5]
                             [--threads 8] [--prefetch N] [--jobs 20000]

Each tree runs its own .venv/bin/python if it has one (else this interpreter)
and needs bench/profile_worker.py (copy it into an older checkout).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

LINE = re.compile(r"([\d,]+) jobs/s; CPU per job: workers (\d+) us.*?, their backends (\d+) us \(load avg ([\d.]+)\)")


def run(tree: Path, args: argparse.Namespace) -> tuple[float, float, float, float] | None:
    python = tree / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), "bench/profile_worker.py", "--repeat", "1",
           "--jobs", str(args.jobs), "--threads", str(args.threads)]
    if args.prefetch:
        cmd += ["--prefetch", str(args.prefetch)]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=600).stdout
    m = LINE.search(out)
    if m is None:
        print(f"  {tree}: no result\n{out[-2000:]}", flush=True)
        return None
    rate, worker, backend, load = m.groups()
    return float(rate.replace(",", "")), float(worker), float(backend), float(load)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", required=True, help="comma-separated checkouts")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--jobs", type=int, default=20_000)
    args = p.parse_args(argv)
    trees = [Path(t) for t in args.trees.split(",")]
    results: dict[Path, list[tuple[float, float, float, float]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            res = run(tree, args)
            if res is not None:
                results[tree].append(res)
                print(f"round {r + 1} {tree.name}: {res[0]:,.0f} jobs/s, worker {res[1]:.0f} us/job, "
                      f"backend {res[2]:.0f} us/job, load {res[3]:.1f} (1-min now {os.getloadavg()[0]:.1f})",
                      flush=True)
    print(f"\n2 processes x {args.threads} threads" + (f", prefetch {args.prefetch}" if args.prefetch else "")
          + f", {args.jobs:,} no-op jobs, medians of {args.rounds} alternating rounds:")
    for tree, rows in results.items():
        if rows:
            med = [statistics.median(x[i] for x in rows) for i in range(4)]
            print(f"  {tree.name:20} {med[0]:8,.0f} jobs/s  worker CPU {med[1]:4.0f} us/job  "
                  f"backend CPU {med[2]:4.0f} us/job  load {med[3]:.1f}  (jobs/s: "
                  f"{', '.join(f'{x[0]:,.0f}' for x in rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
