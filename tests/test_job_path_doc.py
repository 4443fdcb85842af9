"""ARCHITECTURE.md's "A job's path" names the modules of ``supervisor/`` a plain job crosses
from ``send`` to its outcome's write; this test sends one such job through a real broker on
the own executor, traces which modules of ours run for it, and compares.

What counts as the job's: the code that runs in the threads the job passes through, while
it is in flight. Those are the sender's (the test's thread: ``send``, then a wait), the queue's
claim thread (``claims-<queue>``), the worker thread that runs it (``worker``, one of them
here) and the ack batcher (``ack-batcher``), which writes the outcome and then frees the
job's slot; the job's path ends when that release (``Capacity.release_own``) returns in the
batcher. The other threads run whether or not a job is in flight and carry no job: the
wake-up listener (it only sets the queue's event), the due timer, the lease fence's watchdog,
the keeper, the straggler probe, GiveBack, the progress writer and the pool's own workers.

A first job runs untraced, so the one traced takes the warm path (the threads started, the
statements prepared, the actors' budgets cached), as every job after a process's first does.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import dramatiq
import psycopg
import pytest

from supervisor import defaults
from supervisor.broker import PostgresBroker
from supervisor.broker.consuming.capacity import Capacity
from supervisor.broker.consuming.claims import Claims
from supervisor.broker.consuming.fencing import Fence
from supervisor.broker.consuming.pace import Pace
from supervisor.worker import joblog
from supervisor.worker.joblog import JobLog
from supervisor.worker.scheduler import RunResults
from tests.conftest import ROOT, in_process_worker, scalar

QUEUE = "job_path"
PACKAGE = ROOT / "supervisor"
DOC = ROOT / "ARCHITECTURE.md"
# The threads a job passes through besides its sender's (see the module's docstring); claim
# threads are named by queue.
CLAIMS = f"claims-{QUEUE}"
JOB_THREADS = (CLAIMS, "worker", "ack-batcher")
# A claim: what runs in it counts only when it returns rows (see Tracer).
CLAIM = Claims.claim.__code__
# The job's path ends when the batcher frees its slot, after the outcome's commit.
END = Capacity.release_own.__code__


class Tracer:
    """Which files of ``supervisor/`` each thread runs a function of, while ``recording``;
    ``ended`` is set when the ack batcher returns from freeing a slot (see END).

    The claim thread claims again as soon as it has handed a batch on (and when a poll is
    due): such a claim finds nothing and, on the log, asks job_queue (floors, gates, late
    keys) whether it has work. Those claims are the next job's search, not this job's
    path, so what runs inside a claim (``Claims.claim``) counts only if it returned rows."""

    def __init__(self) -> None:
        self.recording = False
        self.seen: dict[str, set[str]] = {}
        self.ended = threading.Event()
        self._prefix = str(PACKAGE) + "/"
        self.threads = (threading.current_thread().name, *JOB_THREADS)  # the sender: this test's
        self._claim: set[str] | None = None  # what the claim in progress ran (the claim thread's)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        # Claims are followed whether or not recording: one under way when recording begins
        # (the search for the next job after the first) is not the traced job's.
        if code is CLAIM:
            if event == "call":
                self._claim = set()
            elif event == "return":
                if arg and self.recording:  # it returned rows: the traced job's claim
                    self.seen.setdefault(CLAIMS, set()).update(self._claim or ())
                self._claim = None
        if not self.recording:
            return
        if event == "call" and code.co_filename.startswith(self._prefix):
            name = threading.current_thread().name
            files = self._claim if self._claim is not None and name == CLAIMS else self.seen.setdefault(name, set())
            files.add(code.co_filename[len(self._prefix):])
        elif event == "return" and code is END and threading.current_thread().name == "ack-batcher":
            self.recording = False
            self.ended.set()

    @property
    def modules(self) -> set[str]:
        return set().union(*(self.seen.get(t, set()) for t in self.threads))

    @property
    def elsewhere(self) -> dict[str, set[str]]:
        return {t: files for t, files in self.seen.items() if t not in self.threads}


@pytest.fixture
def tracer() -> Iterator[Tracer]:
    """Installed for this thread and every thread started from now on (the broker's and
    the worker's threads all start inside the test), removed after."""
    t = Tracer()
    threading.setprofile(t)
    sys.setprofile(t)
    try:
        yield t
    finally:
        t.recording = False
        sys.setprofile(None)
        threading.setprofile(None)


def documented() -> tuple[int, set[str]]:
    """The count and the modules ARCHITECTURE.md's job path gives: the section's table has
    "N modules" in its second column's heading, and a row per stage."""
    section = DOC.read_text().split("\n## A job's path\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    assert rows, "ARCHITECTURE.md's job path has no table of the modules a job crosses"
    header, stages = rows[0], rows[2:]  # rows[1] is the heading's rule
    count = re.search(r"(\d+) modules", header[1])
    assert count, f'ARCHITECTURE.md\'s job path: no "N modules" in the heading of its second column: {header}'
    modules: set[str] = set()
    for row in stages:
        modules.update(re.findall(r"`([\w/]+\.py)`", row[1]))
    return int(count.group(1)), modules


def test_the_documented_job_path_is_the_one_a_job_crosses(conn: psycopg.Connection, database_url: str,
                                                          tracer: Tracer, monkeypatch: pytest.MonkeyPatch) -> None:
    # On the log, one claim in LOG_TABLE_TURN asks job_queue first (ARCHITECTURE.md says so
    # under the table): the job a claim takes depends on how many came before; none does here.
    monkeypatch.setattr(defaults, "LOG_TABLE_TURN", 1 << 30)
    collecting = joblog.collecting
    broker = PostgresBroker(database_url)
    # What a supervised worker adds on a job's path (worker/process.py, WorkerProcess.run):
    # the run results, the job's log line (on by default) and the Fence's run times to Pace.
    broker.add_middleware(RunResults(), before=Fence)
    broker.add_middleware(JobLog("job_path"), before=type(broker.middleware[0]))
    pace = Pace(broker.capacity, 1, 1)
    broker.fence.on_finished = pace.finished
    broker.fence.on_running = pace.running

    @dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="job_path_noop", max_retries=0)
    def noop() -> None:
        pass

    try:
        with in_process_worker(broker, [QUEUE], threads=1, executor="own"):
            noop.send()
            broker.join(QUEUE, timeout=10_000)
            broker.flush_acks(10)
            tracer.recording = True
            message = noop.send()
            assert tracer.ended.wait(10), "the traced job's outcome was not written within 10 s"
    finally:
        broker.close()
        joblog.collecting = collecting  # JobLog's constructor turned it on for the process
    crossed = tracer.modules
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (message.message_id,)) == "succeeded"
    count, listed = documented()
    unknown = sorted(m for m in listed if not (PACKAGE / m).is_file())
    assert not unknown, f"ARCHITECTURE.md's job path names files not in supervisor/: {unknown}"
    assert count == len(listed), f"ARCHITECTURE.md says {count} modules and lists {len(listed)}"

    missing, extra = sorted(crossed - listed), sorted(listed - crossed)
    assert not (missing or extra), (
        "ARCHITECTURE.md's job path is not the one a job crosses:\n"
        f"  crossed but not listed: {missing}\n  listed but not crossed: {extra}\n"
        f"  (run meanwhile in threads the job does not pass through: {tracer.elsewhere})")
