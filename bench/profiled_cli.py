"""`python -m bench.profiled_cli worker ...`: the supervisor CLI under yappi
(every thread), writing the top functions by total time to
$BENCH_PROFILE_DIR/as-profile-<pid>.txt when the process exits.

BENCH_PROFILE=cpu or wall picks yappi's clock. Used by bench/profile_worker.py.
"""

from __future__ import annotations

import atexit
import io
import os

import yappi  # type: ignore[import-not-found]

from supervisor.cli.main import main


def _dump() -> None:
    yappi.stop()
    top = int(os.environ.get("BENCH_PROFILE_TOP", "40"))
    out = io.StringIO()
    stats = yappi.get_func_stats()
    stats.sort("tsub", "desc")
    out.write(f"# pid {os.getpid()}, clock {yappi.get_clock_type()}, sorted by own time (tsub)\n")
    stats.print_all(out=out, columns={0: ("name", 90), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8)})
    lines = out.getvalue().splitlines()
    out2 = io.StringIO()
    stats.sort("ttot", "desc")
    stats.print_all(out=out2, columns={0: ("name", 90), 1: ("ncall", 10), 2: ("tsub", 8), 3: ("ttot", 8)})
    lines2 = out2.getvalue().splitlines()
    threads = io.StringIO()
    yappi.get_thread_stats().print_all(out=threads)
    path = os.path.join(os.environ.get("BENCH_PROFILE_DIR", "/tmp"), f"as-profile-{os.getpid()}.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines[: top + 8]) + "\n\n# sorted by total time (ttot)\n")
        f.write("\n".join(lines2[: top + 8]) + "\n\n" + threads.getvalue())


yappi.set_clock_type(os.environ.get("BENCH_PROFILE", "cpu"))
yappi.start(builtins=False, profile_threads=True)
atexit.register(_dump)
main()
