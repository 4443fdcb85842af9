"""Paced prefetch (broker/consuming/pace.py): rows beyond the threads only while jobs are short.
The pure rule with a real Capacity, then two worker processes and long jobs."""

from __future__ import annotations

import sys
import time

import dramatiq
import pytest

from supervisor import defaults
from supervisor.broker.consuming.capacity import Capacity
from supervisor.broker.consuming.pace import Pace
from tests.conftest import in_process_worker, scalar, wait_for
from tests.supervisor_helpers import enqueue, wait_all_succeeded


@pytest.fixture(params=["table", "log"])
def via(request: pytest.FixtureRequest) -> str:
    """How the long jobs are sent: by SQL into job_queue, or by a producer at the default
    storage into the job log (whose rows go back by being appended again)."""
    return request.param


def given_back(conn) -> int:
    """Times a long (record) job went back to its queue for want of a free thread."""
    return scalar(conn, "SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_id"
                        " WHERE j.actor = 'record' AND e.reason LIKE 'given back unstarted%'")


def run(pace: Pace, seconds: float, jobs: int = 200) -> int:
    for _ in range(jobs):
        pace.finished(seconds)
    return pace.capacity.limit


def test_starts_at_the_thread_count():
    capacity = Capacity(limit=1 << 30)
    Pace(capacity, threads=8, most=32)
    assert capacity.limit == 8


@pytest.mark.parametrize(("seconds", "limit"), [
    (0.0001, 32),   # no-op jobs: the most the process may hold
    (0.019, 29),    # 8 threads free 21 rows within 50 ms
    (0.048, 16),    # ... 8.3 rows: one per thread, so jobs that end together find the next waiting
    (0.15, 10),     # ... 2.7 rows
    (0.5, 8),       # long jobs: nothing waits for a thread
])
def test_rows_beyond_the_threads_wait_under_the_bound(seconds, limit):
    assert defaults.PREFETCH_WAIT_SECONDS == 0.05  # the figures below assume it
    assert run(Pace(Capacity(limit=1), threads=8, most=32), seconds) == limit


def test_follows_the_jobs_down_and_up_again():
    pace = Pace(Capacity(limit=1), threads=4, most=16)
    assert run(pace, 0.0001) == 16
    assert run(pace, 0.3) == 4  # long jobs now: no more hoarding
    assert run(pace, 0.0001) == 16


def test_a_give_back_holds_no_row_beyond_the_threads_until_jobs_are_short_again():
    pace = Pace(Capacity(limit=1), threads=4, most=16)
    assert run(pace, 0.0001) == 16
    pace.gave_back(12)
    assert pace.capacity.limit == 4
    assert run(pace, 0.0001, jobs=5) == 4  # one short job does not undo it
    assert run(pace, 0.0001) == 16


def test_a_fixed_prefetch_drops_to_the_threads_only_until_a_job_ends():
    pace = Pace(Capacity(limit=1), threads=4, most=16, follow=False)
    assert pace.capacity.limit == 16
    pace.running(5.0)  # a long job does not lower a fixed prefetch
    assert pace.capacity.limit == 16
    pace.gave_back(12)
    assert pace.capacity.limit == 4
    assert run(pace, 3.0, jobs=1) == 16


def test_rows_claimed_ahead_of_jobs_that_end_together_wait_a_mean_run_time_before_going_back():
    """A backlog of 50 ms jobs claimed at once ends a wave at a time: the rows held
    beyond the threads wait up to 50 ms for the wave's end, which is no sign of long
    jobs (GiveBack gave them back after 20 ms, and the process stopped claiming ahead)."""
    pace = Pace(Capacity(limit=1), threads=16, most=64)
    assert run(pace, 0.048) == 32
    assert pace.patience() == pytest.approx(0.048, rel=0.01)
    assert run(pace, 0.0001) == 64
    assert pace.patience() == defaults.GIVE_BACK_SECONDS  # short jobs: a spell of 20 ms is long
    pace.gave_back()
    assert pace.patience() <= 0.1  # never long, whatever the mean
    assert Pace(Capacity(limit=1), threads=4, most=16, follow=False).patience() == defaults.GIVE_BACK_SECONDS


def test_a_paced_process_claims_ahead_of_its_threads_within_the_bound(conn, broker):
    """8 threads of 20 ms jobs, paced as `supervisor worker` paces them (a Pace on the
    process's capacity, fed by the Fence). Once the mean is known, rows beyond the
    threads are held while every thread runs: the claim for a thread's next row went
    out before its job ended, so the thread finds it waiting. The rows held (running,
    waiting, or asked for by a claim under way) never pass threads + the rows the
    threads free within the wait: 8 + 8 x 10 ms / 20 ms = 12. The old rule (whole rows
    per thread, none for jobs over 10 ms) held 8 and claimed only once a job ended."""
    threads, seconds, jobs = 8, 0.02, 400
    held: list[int] = []  # rows the process held at each job's start (list.append: atomic)

    def timed() -> None:
        held.append(broker.capacity.used)
        time.sleep(seconds)  # the workload itself: a job of 20 ms

    actor = dramatiq.actor(timed, broker=broker, queue_name="pace", actor_name="timed", max_retries=0)
    most = defaults.capacity(threads, None)
    with in_process_worker(broker, ["pace"], threads=threads, prefetch=most, executor="own"):
        pace = Pace(broker.capacity, threads, most)
        broker.fence.on_finished = pace.finished
        broker.fence.on_running = pace.running
        # An idle claim may have reserved the whole capacity before the Pace lowered it:
        # once nothing is reserved, every claim reserves under the Pace's limit.
        wait_for(lambda: broker.capacity.used == 0, 10)
        broker.enqueue_many([actor.message() for _ in range(jobs)])
        broker.join("pace", timeout=60_000)
    assert len(held) == jobs
    bound = threads + int(threads * defaults.PREFETCH_WAIT_SECONDS / seconds)
    assert max(held) <= bound, max(held)
    settled = held[100:]  # from ~160 ms down to the jobs' 20 ms: ~60 jobs
    ahead = sum(1 for n in settled if n > threads)
    assert ahead >= len(settled) // 2, (ahead, len(settled))
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'timed' AND status = 'succeeded'") == jobs


def test_long_jobs_are_not_hoarded_by_one_process(conn, workers, via):
    """Two paced processes of 2 threads, 4 jobs of 1 s: each runs 2 at once, so the
    4 run together; a process that took all 4 would make 2 of them wait a second."""
    procs = [workers(threads=2) for _ in range(2)]
    for p in procs:
        p.wait_ready(conn)
    enqueue(conn, 4, sleep_s=1.0, via=via)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'running'") == 4, 10)
    held = dict(conn.execute("SELECT lease_owner, count(*) FROM jobs WHERE status = 'running' GROUP BY 1").fetchall())
    assert sorted(held.values()) == [2, 2], held
    wait_all_succeeded(conn, 4, timeout=20)
    assert scalar(conn, "SELECT count(DISTINCT pid) FROM test_results") == 2


def test_a_long_job_still_running_slows_the_claims_before_it_ends():
    pace = Pace(Capacity(limit=1), threads=4, most=16)
    assert run(pace, 0.0001) == 16
    for elapsed in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):  # the fence's checks while one job runs on
        pace.running(elapsed)
    assert pace.capacity.limit == 4



def test_a_switch_from_short_to_long_jobs_strands_nothing(conn, workers, via):
    """A paced process of 1 thread, warmed up by 2,000 no-op jobs (it holds 4 rows then),
    claims both of two 3 s jobs sent together: the other process, busy for a second
    when they arrive, cannot take either. Once it is free, the row waiting behind the
    first job must run there at once, not 3 s later behind the first."""
    hoarder = workers(threads=1)
    hoarder.wait_ready(conn)
    enqueue(conn, 2000, actor="nap")
    wait_all_succeeded(conn, 2000, timeout=60)
    other = workers(threads=1, queues="tests,busy")
    other.wait_ready(conn)
    enqueue(conn, 1, sleep_s=1.0, queue="busy", actor="nap")
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE queue = 'busy' AND status = 'running'"), 10)
    enqueue(conn, 2, sleep_s=3.0, via=via)  # one statement: one claim of the idle process takes both
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM test_results") >= 2, 20, message=_story(conn))
    (pid_a, start_a, end_a), (pid_b, start_b, _) = conn.execute(
        "SELECT pid, started, at FROM test_results ORDER BY started").fetchall()
    assert pid_a == hoarder.pid and pid_b == other.pid, "both ran on one process, one after the other"
    # The second started when the other process freed its thread (~1 s), not 3 s later.
    assert (start_b - start_a).total_seconds() < 2.0 and start_b < end_a
    wait_all_succeeded(conn, 2003)
    assert scalar(conn, "SELECT count(DISTINCT job_id) FROM test_results") == 2  # each ran once
    assert given_back(conn) >= 1


class _story:
    """A wait's message: what became of the record jobs (their statuses and events)."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def __str__(self) -> str:
        jobs = self.conn.execute("SELECT id, status, attempts, lease_owner FROM jobs WHERE actor = 'record'").fetchall()
        events = self.conn.execute("SELECT e.job_id, e.from_status, e.to_status, e.who, e.reason FROM job_events e"
                                   " JOIN jobs j ON j.id = e.job_id WHERE j.actor = 'record' ORDER BY e.id").fetchall()
        runs = self.conn.execute("SELECT job_id, pid, started FROM test_results ORDER BY id").fetchall()
        log_rows = self.conn.execute("SELECT seq, day, tx, id, attempts FROM job_log WHERE actor = 'record'"
                                     " ORDER BY seq").fetchall()
        done = self.conn.execute("SELECT seq, day, id, status, attempt, owner FROM job_done WHERE actor = 'record'"
                                 " ORDER BY seq").fetchall()
        leases = self.conn.execute("SELECT batch, owner, seqs, expires_at > now() FROM job_lease").fetchall()
        cursors = self.conn.execute("SELECT * FROM job_cursor ORDER BY 1 DESC LIMIT 6").fetchall()
        return (f"two runs; jobs {jobs}; events {events}; runs {runs}; log {log_rows}; done {done};"
                f" leases {leases}; cursors {cursors}")


@pytest.mark.parametrize("prefetch", [None, 4])
def test_a_row_given_back_comes_back_once_without_churn(conn, workers, prefetch, via):
    """One process of 1 thread holding up to 4 rows (paced and warmed up, or a fixed
    prefetch of 4) claims two 1 s jobs: the second goes back once, and while the first
    runs it is not claimed and given back again and again; each runs exactly once."""
    argv = None
    if prefetch is not None:
        argv = [sys.executable, "-m", "supervisor.cli", "worker", "--queues", "tests", "--actors",
                "tests.sample_actors", "--threads", "1", "--prefetch", str(prefetch), "--no-migrate",
                "--log-level", "WARNING"]
    proc = workers(threads=1, argv=argv)
    proc.wait_ready(conn)
    if prefetch is None:
        enqueue(conn, 2000, actor="nap")
        wait_all_succeeded(conn, 2000, timeout=60)
    enqueue(conn, 2, sleep_s=1.0, via=via)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM test_results") == 2, 20)
    wait_all_succeeded(conn, 2 if prefetch else 2002)
    assert scalar(conn, "SELECT count(DISTINCT job_id) FROM test_results") == 2
    assert 1 <= given_back(conn) <= 2, given_back(conn)


def test_a_batch_wakes_the_threads_its_actors_means_say_it_needs():
    pace = Pace(Capacity(limit=1), threads=8, most=64)

    class Msg:
        def __init__(self, actor: str) -> None:
            self.actor_name = actor

    assert pace.wakes([Msg("quick")] * 64) is None  # never ran here: one thread per message
    for _ in range(50):
        pace.finished(0.00002, "quick")
        pace.finished(0.05, "slow")
    assert pace.wakes([Msg("quick")] * 64) == 1  # 64 x 20 us: one thread's slice
    assert pace.wakes([Msg("quick")] * 150) == 2  # 3 ms
    assert pace.wakes([Msg("slow")] * 16) >= 400  # more than it has: every waiting one
    assert pace.wakes([Msg("quick"), Msg("slow")]) in (25, 26)
    assert pace.wakes([Msg("quick"), Msg("new")]) is None


def test_waiting_threads_are_woken_when_no_row_is_taken_between_two_looks():
    """put_batch wakes as many waiting threads as it is told; a nudge that finds rows
    waiting and none taken since the last one wakes the rest. Real threads, each of
    which takes one row and then holds it (a job longer than its actor's mean)."""
    import threading

    from supervisor.worker.executor_threads import WorkQueue

    work = WorkQueue()
    release = threading.Event()
    took: list[int] = []
    taken = threading.Condition()

    def thread() -> None:
        item = work.get()
        with taken:
            took.append(item.seq)
            taken.notify_all()
        release.wait(30)
        work.task_done()

    threads = [threading.Thread(target=thread, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(work.not_empty._waiters) == 4, 10)  # noqa: SLF001  (all four wait)

    class Msg:
        actor_name = "quick"

    work.put_batch([Msg()] * 4, lambda m: 0, wake=1)  # type: ignore[list-item]
    with taken:
        assert taken.wait_for(lambda: len(took) == 1, 10)
    assert work.qsize() == 3  # no other thread was woken: three rows wait
    assert work.nudge() == 0  # a row was taken since the last look: the awake one keeps up
    assert work.qsize() == 3
    assert work.nudge() == 3  # none taken since: the waiting threads are woken
    with taken:
        assert taken.wait_for(lambda: len(took) == 4, 10)
    release.set()
    for t in threads:
        t.join(10)
    work.join()


def test_rows_behind_a_known_quick_actor_turned_slow_do_not_wait_for_it(conn, workers, via):
    """A paced process of 4 threads learns that `record` is quick (2,000 runs), so a
    batch of its rows wakes one or two threads. Four 1 s runs of it claimed together must
    still run together, not one after the other: the waiting threads are woken by
    GiveBack's look (every 10 ms, WorkQueue.nudge) or their own (every 100 ms)."""
    proc = workers(threads=4)
    proc.wait_ready(conn)
    enqueue(conn, 2000)
    wait_all_succeeded(conn, 2000, timeout=60)
    conn.execute("TRUNCATE test_results")
    enqueue(conn, 4, sleep_s=1.0, via=via)  # one statement: one claim takes all four
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM test_results") == 4, 20)
    spread = scalar(conn, "SELECT extract(epoch FROM max(started) - min(started)) FROM test_results")
    assert spread < 0.25, f"the four started {spread:.2f} s apart"
    wait_all_succeeded(conn, 2004)
    assert scalar(conn, "SELECT count(DISTINCT job_id) FROM test_results") == 4
