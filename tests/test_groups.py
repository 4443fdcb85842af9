"""Group completion callbacks and supervisor.pipeline's group steps on PostgreSQL (issue 41):
the issue's snippet under `supervisor run` with a worker SIGKILLed while members run, a
member counted once however often it runs, and fan-out / fan-in with a failing member,
also one that ends with no middleware run (its lease-loss budget spent under SIGKILL, an
operator's cancel, an unreadable row, a flush), in both stores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

import dramatiq
import pytest
from dramatiq.message import Message
from dramatiq.rate_limits import Barrier

import supervisor
from supervisor import defaults
from supervisor.admin import cancel_job
from supervisor.broker import PostgresBroker
from supervisor.broker.groups import GroupCallbacks
from tests.conftest import ROOT, in_process_worker, scalar, wait_for
from tests.supervisor_helpers import role, write_config

# The snippet, as a producer runs it: the broker from setup_broker(), plain actors.
SNIPPET = """
import dramatiq, supervisor
supervisor.setup_broker()
from tests.workflow_actors import group_done, member
g = dramatiq.group([member.message(i, 0.2) for i in range(50)])
g.add_completion_callback(group_done.message())
g.run()
"""


def test_a_group_callback_runs_once_after_every_member_though_a_worker_is_killed(tmp_path, conn, database_url,
                                                                                 supervisor):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=4, actors=("tests.workflow_actors",))})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    sent = subprocess.run([sys.executable, "-c", SNIPPET], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)})
    assert sent.returncode == 0, sent.stderr
    # members under way in both processes: kill one of them while its members run
    wait_for(lambda: scalar(conn, "SELECT count(DISTINCT lease_owner) FROM jobs WHERE status = 'running'") == 2
             and scalar(conn, "SELECT count(*) FROM test_results WHERE tag = 'member'") >= 4, 30,
             message="members running in both processes")
    victim = scalar(conn, "SELECT w.pid FROM jobs j JOIN workers w ON w.id = j.lease_owner"
                          " WHERE j.status = 'running' LIMIT 1")
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 51, 90, interval=0.1,
             message="50 members and the callback to succeed; now "
             + str(conn.execute("SELECT actor, status, count(*) FROM jobs GROUP BY 1, 2").fetchall()))
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status <> 'succeeded'") == 0
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'member' AND lease_losses > 0") >= 1  # killed mid-run
    assert scalar(conn, "SELECT count(*) FROM test_results WHERE tag = 'done'") == 1
    # every member had run (its first run recorded) before the callback started
    assert scalar(conn, """
        SELECT count(*) FROM (SELECT n, min(started) AS first FROM test_results WHERE tag = 'member' GROUP BY n) m
         WHERE m.first < (SELECT started FROM test_results WHERE tag = 'done')""") == 50
    assert victim not in s.pids()  # replaced by the master


# A pipeline through a group of 20, sent as a producer would.
PIPELINE = """
import dramatiq, supervisor
supervisor.setup_broker()
from tests.workflow_actors import collected, member, seed
supervisor.pipeline([seed.message(7), dramatiq.group([member.message(i, 0.2) for i in range(20)]),
                     collected.message()]).run()
"""


def test_a_pipelines_group_fans_in_once_though_a_worker_is_killed(tmp_path, conn, database_url, supervisor):
    """Each member receives the seed's 7 after its own arguments (member(n, 0.2, 7) returns n);
    the step after the group runs once, with the 20 results in member order."""
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=4, actors=("tests.workflow_actors",))})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    sent = subprocess.run([sys.executable, "-c", PIPELINE], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)})
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: scalar(conn, "SELECT count(DISTINCT lease_owner) FROM jobs WHERE status = 'running'"
                                  " AND actor = 'member'") == 2, 30, message="members running in both processes")
    victim = scalar(conn, "SELECT w.pid FROM jobs j JOIN workers w ON w.id = j.lease_owner"
                          " WHERE j.status = 'running' AND j.actor = 'member' LIMIT 1")
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 22, 90, interval=0.1,
             message="the seed, 20 members and the last step to succeed; now "
             + str(conn.execute("SELECT actor, status, count(*) FROM jobs GROUP BY 1, 2").fetchall()))
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'member' AND lease_losses > 0") >= 1
    assert scalar(conn, "SELECT count(DISTINCT n) FROM test_results WHERE tag = 'member<-7'") == 20
    assert scalar(conn, "SELECT count(*) FROM test_results WHERE tag LIKE 'member%' AND tag <> 'member<-7'") == 0
    rows = conn.execute("SELECT tag FROM test_results WHERE tag LIKE 'collected:%'").fetchall()
    assert rows == [("collected:" + ",".join(str(i) for i in range(20)),)]


@pytest.fixture
def steps(broker: PostgresBroker) -> dict[str, Any]:
    """Actors on the test's broker for the pipeline tests; ``seen`` gets what ``collect`` received."""
    seen: list[Any] = []
    arrived = threading.Event()

    def actor(fn: Any, **options: Any) -> Any:
        return dramatiq.actor(broker=broker, queue_name="wf", actor_name=f"wf_{fn.__name__}", max_retries=0,
                              **options)(fn)

    def seed(x: int) -> int:
        return x

    def square(x: int) -> int:
        return x * x

    def plus(y: int, x: int) -> int:
        return x + y

    def double(x: int) -> int:
        return 2 * x

    def total(values: list[int]) -> int:
        return sum(values)

    def boom(x: int) -> None:
        raise RuntimeError(f"boom on {x}")

    def collect(value: Any) -> None:
        seen.append(value)
        arrived.set()

    made = {fn.__name__: actor(fn) for fn in (seed, square, plus, double, total, boom, collect)}
    return {**made, "seen": seen, "arrived": arrived}


def test_a_pipeline_fans_out_to_groups_and_in_to_the_next_step(conn, broker, steps):
    a = steps
    p = supervisor.pipeline([
        a["seed"].message(3),
        dramatiq.group([a["square"].message(), a["plus"].message(10), a["double"].message()], broker=broker),
        a["total"].message(),
        dramatiq.group([a["double"].message(), a["double"].message_with_options(args=(100,), pipe_ignore=True)],
                       broker=broker),
        a["collect"].message(),
    ], broker=broker)
    assert len(p) == 5
    with in_process_worker(broker, ["wf"]):
        p.run()
        assert a["arrived"].wait(30)
    # 3 -> [9, 13, 6] -> 28 -> [56, 200] (the second member ignores the piped value)
    assert a["seen"] == [[56, 200]]
    assert scalar(conn, "SELECT count(*) FROM pipeline_fanins WHERE arrived = size AND failed IS NULL") == 2


def test_a_pipeline_may_start_with_a_group_and_of_messages_only_is_dramatiqs(conn, broker, steps):
    a = steps
    first = supervisor.pipeline([dramatiq.group([a["seed"].message(1), a["seed"].message(2)], broker=broker),
                                 a["total"].message(), a["collect"].message()], broker=broker)
    plain = supervisor.pipeline([a["seed"].message(5), a["double"].message()], broker=broker) | a["collect"].message()
    assert "pipe_target" in plain.messages[0].options  # Dramatiq's own chaining
    with in_process_worker(broker, ["wf"]):
        first.run()
        wait_for(lambda: a["seen"] == [3], 30, message="the group's sum")
        plain.run()
        wait_for(lambda: sorted(a["seen"]) == [3, 10], 30, message="the plain pipeline's result")


def test_a_member_that_fails_for_good_stops_the_rest(conn, broker, steps, caplog):
    a = steps
    p = supervisor.pipeline([a["seed"].message(1), dramatiq.group([a["double"].message(), a["boom"].message()], broker=broker),
                             a["collect"].message()], broker=broker)
    with in_process_worker(broker, ["wf"]):
        p.run()
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor IN ('wf_double', 'wf_boom')"
                                      " AND status IN ('succeeded', 'failed')") == 2, 30,
                 message="both members to finish")
    size, arrived, failed = conn.execute("SELECT size, arrived, failed FROM pipeline_fanins").fetchone()
    assert (size, arrived) == (2, 1)
    assert "member 1 (wf_boom, message" in failed and "RuntimeError: boom on 1" in failed
    assert "the rest of the pipeline will not run" in caplog.text
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'wf_collect'") == 0
    assert a["seen"] == []


def test_a_member_run_again_counts_once(conn, broker):
    """Its process killed after its arrival, before its ack, a member runs again: the
    barrier counts it once, and the callback is sent once, by the last distinct member."""
    dramatiq.actor(broker=broker, queue_name="wf", actor_name="wf_cb")(lambda: None)
    callback = Message(queue_name="wf", actor_name="wf_cb", args=(), kwargs={}, options={})
    Barrier(broker.limiter, "g1", ttl=60_000).create(parties=2)
    middleware = next(m for m in broker.middleware if isinstance(m, GroupCallbacks))

    def ran(member: str) -> None:
        message = Message(queue_name="wf", actor_name="wf_cb", args=(), kwargs={}, message_id=member,
                          options={"group_completion_uuid": "g1", "group_completion_callbacks": [callback.asdict()]})
        middleware.after_process_message(broker, message, result=None)

    ran("3b4c1f7e-0000-4000-8000-000000000001")
    ran("3b4c1f7e-0000-4000-8000-000000000001")  # again: not the second party
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'wf_cb'") == 0
    ran("3b4c1f7e-0000-4000-8000-000000000002")
    ran("3b4c1f7e-0000-4000-8000-000000000002")
    ran("3b4c1f7e-0000-4000-8000-000000000001")
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'wf_cb'") == 1


def test_a_group_of_pipelines_calls_back_once_on_the_default_middleware(conn, broker, steps):
    """Dramatiq's group of pipelines: the last message of each pipeline counts at the barrier."""
    a = steps
    g = dramatiq.group([dramatiq.pipeline([a["seed"].message(i), a["double"].message()], broker=broker)
                        for i in range(3)], broker=broker)
    g.add_completion_callback(a["collect"].message("all done"))
    with in_process_worker(broker, ["wf"]):
        g.run()
        assert a["arrived"].wait(30)
        wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status <> 'succeeded'") == 0, 30,
                 message="every job to finish")
    assert a["seen"] == ["all done"]
    assert scalar(conn, "SELECT count(*) FROM group_arrivals") == 3


# Issue 41: a member that ends without its middleware (SQL alone wrote its end) fails its
# fan-in all the same (migration 048). Member 1 sleeps until it is killed; its budget of one
# lease loss makes the release fail it.
KILLED_PIPELINE = """
import dramatiq, supervisor
supervisor.setup_broker()
from tests.workflow_actors import collected, member, seed
supervisor.pipeline([seed.message(7), dramatiq.group([member.message(0, 0), member.message_with_options(
    args=(1, 120), max_lease_losses=1)]), collected.message()]).run()
"""


def test_a_member_failed_by_its_lease_loss_budget_fails_the_pipeline(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=2, actors=("tests.workflow_actors",))})
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    sent = subprocess.run([sys.executable, "-c", KILLED_PIPELINE], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)})
    assert sent.returncode == 0, sent.stderr
    running = "FROM jobs j JOIN workers w ON w.id = j.lease_owner WHERE j.actor = 'member' AND j.args->>0 = '1'" \
              " AND j.status = 'running'"
    wait_for(lambda: scalar(conn, "SELECT count(*) " + running) == 1, 30, message="member 1 to run")
    victim, job = conn.execute("SELECT w.pid, j.id " + running).fetchone()
    # where the members live: the log (the worker that ran the seed sent them)
    in_queue = scalar(conn, "SELECT count(*) FROM job_queue WHERE id = %s", (job,)) + scalar(
        conn, "SELECT count(*) FROM job_history WHERE id = %s", (job,))
    assert in_queue == 0
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM pipeline_fanins WHERE failed IS NOT NULL") == 1, 60,
             interval=0.05, message="the fan-in to be marked failed; jobs now "
             + str(conn.execute("SELECT actor, status, count(*) FROM jobs GROUP BY 1, 2").fetchall()))
    failed = scalar(conn, "SELECT failed FROM pipeline_fanins")
    assert failed.startswith(f"member 1 (member, message {job}) failed for good: failed by its lease-loss budget"
                             " (poison pill: lease lost 1 times"), failed
    assert "max_lease_losses=1" in failed
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'member' AND status = 'succeeded'") == 1,
             30, message="member 0 to succeed")
    assert conn.execute("SELECT status, lease_losses FROM jobs WHERE id = %s", (job,)).fetchone() == ("failed", 1)
    assert scalar(conn, "SELECT arrived FROM pipeline_fanins") == 1
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'collected'") == 0
    assert scalar(conn, "SELECT count(*) FROM test_results WHERE tag LIKE 'collected%'") == 0


def _group_first(broker: PostgresBroker, a: dict[str, Any], *members: Message[Any]) -> None:
    supervisor.pipeline([dramatiq.group(list(members), broker=broker), a["collect"].message()], broker=broker).run()


def _member_id(conn, actor: str, first_arg: int) -> str:
    return str(scalar(conn, "SELECT id FROM jobs WHERE actor = %s AND args->>0 = %s", (actor, str(first_arg))))


def _finish(conn, broker: PostgresBroker, statuses: list[str]) -> None:
    """Run the queue until its members ended as ``statuses`` say (sorted)."""
    with in_process_worker(broker, ["wf"]):
        wait_for(lambda: sorted(r[0] for r in conn.execute(
            "SELECT status FROM jobs WHERE actor <> 'wf_collect'").fetchall()) == statuses, 30,
            message=f"the members to end {statuses}")


def test_a_member_cancelled_by_an_operator_fails_the_pipeline(conn, broker, steps):
    a = steps
    _group_first(broker, a, a["seed"].message(1), a["seed"].message(2))
    cancelled = _member_id(conn, "wf_seed", 2)
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (cancelled,)) == 1
    assert cancel_job(conn, cancelled)
    _finish(conn, broker, ["cancelled", "succeeded"])
    size, arrived, failed = conn.execute("SELECT size, arrived, failed FROM pipeline_fanins").fetchone()
    assert (size, arrived) == (2, 1)
    assert failed == f"member 1 (wf_seed, message {cancelled}) failed for good: cancelled by an operator"
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'wf_collect'") == 0
    assert a["seen"] == []
    # the fan-in's row made by the cancel expires as GroupSteps' own do
    ttl = scalar(conn, "SELECT extract(epoch FROM expires_at - created_at) * 1000 FROM pipeline_fanins")
    assert abs(float(ttl) - defaults.FANIN_TTL_MS) < 60_000


def test_a_member_flushed_or_unreadable_fails_the_pipeline(conn, broker, steps):
    a = steps
    # a member no worker knows: its claim fails it at once (Leases.fail_unreadable), no middleware
    nobody = Message(queue_name="wf", actor_name="wf_nobody", args=(5,), kwargs={}, options={})
    _group_first(broker, a, a["seed"].message(4), nobody)
    _finish(conn, broker, ["failed", "succeeded"])
    failed = scalar(conn, "SELECT failed FROM pipeline_fanins")
    assert failed.startswith(f"member 1 (wf_nobody, message {nobody.message_id}) failed for good: failed: cannot"
                             " become a message: actor: no actor named wf_nobody"), failed
    conn.execute("DELETE FROM pipeline_fanins")
    # Broker.flush drops a queue's waiting jobs (job_queue's with no history at all)
    _group_first(broker, a, a["seed"].message(6), a["seed"].message(7))
    broker.flush("wf")
    reasons = [r[0] for r in conn.execute("SELECT failed FROM pipeline_fanins").fetchall()]
    assert len(reasons) == 1 and reasons[0].endswith("failed for good: cancelled: its queue was flushed"), reasons
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE actor = 'wf_collect'") == 0


def test_only_the_failed_and_cancelled_ends_carry_the_fanin_trigger(conn):
    """A job that succeeds pays nothing for the fan-in's rule: no trigger where it is archived,
    and job_done's fires (its WHEN) only for a failed or cancelled row."""
    rows = dict(conn.execute("""
        SELECT c.relname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE t.tgname LIKE 'pipeline_member_%' AND NOT t.tgisinternal AND t.tgparentid = 0""").fetchall())
    assert set(rows) == {"job_history_failed", "job_history_cancelled", "job_done"}
    assert "WHEN ((new.status = ANY (ARRAY['failed'::text, 'cancelled'::text])))" in rows["job_done"]
    assert scalar(conn, """
        SELECT count(*) FROM pg_trigger t JOIN pg_inherits i ON i.inhrelid = t.tgrelid
         WHERE t.tgname LIKE 'pipeline_member_%' AND i.inhparent = 'job_history_succeeded'::regclass""") == 0
