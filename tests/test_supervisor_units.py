"""The master's pure decisions (what to start, what to drain, crash backoff) and
the child's resource guard, without processes."""

from __future__ import annotations

import os
import signal

from supervisor.config import Limits, RoleConfig
from supervisor.master.children import Child, RoleState, describe_exit, plan
from supervisor.worker.guard import Guard, Reading
from supervisor.worker.settings import WorkerSettings


def role_state(processes: int = 2) -> RoleState:
    cfg = RoleConfig(name="r", queues=("q",), actors=("m",), processes=processes)
    return RoleState(cfg, WorkerSettings(role=cfg))


def add(role: RoleState, pid: int, *, ready: bool = True, generation: int | None = None, at: float = 0.0) -> Child:
    c = Child(pid=pid, role="r", slot=pid, generation=generation or role.generation, owner=f"o{pid}", fd=-1,
              forked_at=at, ready_at=at if ready else None)
    role.children[pid] = c
    return c


def test_starts_what_is_missing_and_drains_the_newest_extra():
    role = role_state(3)
    assert plan(role, 0.0) == (3, [])
    for pid in (1, 2, 3):
        add(role, pid, at=pid)
    assert plan(role, 10.0) == (0, [])
    role.override = 1
    start, drains = plan(role, 10.0)
    assert start == 0 and [c.pid for c, _ in drains] == [3, 2] and drains[0][1] == "scaled down"


def test_roll_is_one_by_one_with_one_extra_process():
    role = role_state(2)
    a, b = add(role, 1, at=1), add(role, 2, at=2)
    role.generation += 1
    assert plan(role, 5.0) == (1, [])  # one new process first; nobody drained yet
    new = add(role, 3, ready=False)
    assert plan(role, 5.0) == (0, [])  # wait for it to be ready
    new.ready_at = 6.0
    start, drains = plan(role, 6.0)
    assert [c.pid for c, _ in drains] == [a.pid] and drains[0][1] == "rolled"
    a.term_at = 6.0  # the arbiter stops it
    assert plan(role, 6.0) == (1, [])  # and the next new one starts
    add(role, 4, at=7.0)
    start, drains = plan(role, 7.0)
    assert start == 0 and [c.pid for c, _ in drains] == [b.pid]


def test_crash_backoff_grows_is_capped_and_probes_with_one():
    role = role_state(3)
    for n in range(1, 8):
        c = add(role, 100 + n, ready=False, at=float(n))
        del role.children[c.pid]
        role.record_exit(c, "exit 3", expected=False, now=float(n), backoff=0.5, backoff_max=4.0)
    assert role.restarts == 7 and role.crash_looping
    assert role.next_start == 7.0 + 4.0  # capped
    assert plan(role, 8.0) == (0, [])  # waiting out the backoff
    assert plan(role, 11.0) == (1, [])  # then one probe, not three
    probe = add(role, 200, ready=False, at=11.0)
    assert plan(role, 11.5) == (0, [])
    probe.ready_at = 11.5
    assert not role.crash_looping
    assert plan(role, 11.5) == (2, [])  # it started: the rest follow at once
    role.settle_streak(11.5 + 5.0)
    assert role.streak == 0


def test_a_ready_child_killed_is_replaced_at_once_however_young():
    role = role_state(3)
    for n in range(1, 6):  # a kill storm: one young, ready child killed every second
        c = add(role, n, at=float(n))
        c.ready_at = n + 0.2
        del role.children[c.pid]
        role.record_exit(c, "killed by SIGKILL", expected=False, now=n + 1.5, backoff=0.5, backoff_max=4.0)
        assert role.streak == 0 and role.next_start <= n + 1.5
        assert plan(role, n + 1.5) == (3, [])  # no backoff: start the replacement now
    assert role.restarts == 5 and not role.crash_looping
    # dying right after ready is a failed start: backoff, as for one that never got ready
    c = add(role, 9, at=10.0)
    c.ready_at = 10.2
    del role.children[9]
    role.record_exit(c, "killed by SIGKILL", expected=False, now=10.5, backoff=0.5, backoff_max=4.0)
    assert role.streak == 1 and role.next_start == 11.0 and plan(role, 10.6) == (0, [])


def test_expected_exits_are_not_crashes():
    role = role_state(1)
    c = add(role, 1)
    del role.children[1]
    role.record_exit(c, "rolled; exited 0", expected=True, now=1.0, backoff=0.5, backoff_max=4.0)
    assert role.restarts == 0 and role.streak == 0 and role.last_exit == "rolled; exited 0"


def test_describe_exit():
    assert describe_exit(3 << 8).startswith("exit 3: actor modules cannot be imported")
    assert describe_exit(0) == "exited 0"
    assert describe_exit(signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(70 << 8) == "exit 70"


def test_child_feed_parses_whole_lines_only():
    c = Child(pid=1, role="r", slot=1, generation=1, owner="o", fd=-1, forked_at=0.0)
    assert c.feed(b'{"e":"ready","owner":"o"}\n{"e":"beat","state":"run', 1.0)[0]["e"] == "ready"
    assert c.ready and c.last_beat == 1.0
    events = c.feed(b'ning","rss":100,"cpu":1.5,"in_flight":2,"done":9,"paused":null}\ngarbage\n', 2.0)
    assert [e["e"] for e in events] == ["beat"]
    assert (c.state, c.rss, c.in_flight, c.done) == ("running", 100, 2, 9)


class FakeBroker:
    def __init__(self) -> None:
        self.claiming = True

    def pause_claiming(self) -> None:
        self.claiming = False

    def resume_claiming(self) -> None:
        self.claiming = True


def test_guard_pauses_resumes_with_hysteresis_and_asks_to_recycle_once():
    asked: list[str] = []
    guard = Guard(Limits(memory_percent=80, max_rss=100 << 20, max_jobs=10), asked.append)
    broker = FakeBroker()
    readings = iter([
        Reading(memory_percent=85, cpu_percent=0, rss=50 << 20, process_cpu=0),
        Reading(memory_percent=75, cpu_percent=0, rss=50 << 20, process_cpu=0),  # under 80 but over 72
        Reading(memory_percent=70, cpu_percent=0, rss=200 << 20, process_cpu=0),
        Reading(memory_percent=70, cpu_percent=0, rss=300 << 20, process_cpu=0),
    ])
    guard.read = lambda: next(readings)
    guard.check(broker, jobs_done=0)
    assert not broker.claiming and "host memory 85%" in guard.paused_for
    guard.check(broker, jobs_done=0)
    assert not broker.claiming  # not yet: resume needs 90% of the threshold
    guard.check(broker, jobs_done=0)
    assert broker.claiming and guard.paused_for is None
    assert asked == ["max_rss: 200MB > 100MB"]
    guard.check(broker, jobs_done=50)
    assert len(asked) == 1  # asked once; the master takes it from there


def test_guard_reads_this_process():
    guard = Guard(Limits(memory_percent=None), lambda why: None)
    r = guard.read()
    assert r.rss > 10 << 20 and r.memory_percent == 0.0  # host figures only when a limit asks for them
    assert os.getpid() == guard._proc.pid


def test_a_silent_child_is_killed_before_a_lease_renewed_every_heartbeat_can_expire():
    from supervisor.master.children import silent_limits

    for lease, heartbeat, beat, grace in ((30, 10, 1, 5), (5, 1, 1, 5), (4, 0.5, 0.5, 30), (60, 5, 1, 120)):
        silent, kill_after = silent_limits(lease, heartbeat, beat, grace)
        assert silent >= 3 * beat  # one late beat is no hang
        assert silent + kill_after < lease - heartbeat, (lease, heartbeat, silent, kill_after)
        assert kill_after <= grace
