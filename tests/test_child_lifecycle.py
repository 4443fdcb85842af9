"""A child's lifecycle as the master keeps it (master/lifecycle.py), the typed
messages of the beat pipe (master/beats.py) and the process kinds' reload diff,
without processes (the supervisor tests run them for real)."""

from __future__ import annotations

import logging
import re
import select
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.config import load
from supervisor.master import beats
from supervisor.master.beats import Activity, BadMessage, Beat, BeatReader, Draining, Ready, Recycle
from supervisor.master.lifecycle import RECYCLE_JITTER, TRANSITIONS, Child, Event, IllegalTransition, Phase
from supervisor.master.reload import diff
from supervisor.servers import ServerSeen

ROOT = Path(__file__).resolve().parent.parent
BEAT = Beat(state=Activity.PAUSED, rss=100, cpu=1.5, in_flight=2, done=9, paused="host memory 90%")


def child(pid: int = 1) -> Child:
    return Child(pid=pid, role="r", slot=1, generation=1, owner="o", fd=-1, forked_at=0.0)


# The legal way into each phase, from a new child.
PATHS: dict[Phase, list[Event]] = {
    Phase.STARTING: [],
    Phase.READY: [Event.READY],
    Phase.RECYCLE_ASKED: [Event.READY, Event.ASK_RECYCLE],
    Phase.RECYCLING: [Event.READY, Event.ASK_RECYCLE, Event.RECYCLE],
    Phase.STOPPING: [Event.STOP],
    Phase.KILLED: [Event.STOP, Event.KILL],
    Phase.EXITED: [Event.EXIT],
}


def apply(c: Child, event: Event, now: float = 1.0) -> None:
    """The one method of each transition."""
    {
        Event.READY: lambda: c.said_ready(now),
        Event.ASK_RECYCLE: lambda: c.asked_recycle("max_jobs: 10", now),
        Event.RECYCLE: c.give_recycle_turn,
        Event.STOP: lambda: c.terminate("rolled", 5.0, now),
        Event.KILL: c.kill,
        Event.EXIT: c.reaped,
    }[event]()


@pytest.mark.parametrize("event", list(Event), ids=lambda e: e.name)
@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.name)
def test_each_event_goes_where_the_table_says_or_raises(phase: Phase, event: Event) -> None:
    c = child()
    for step in PATHS[phase]:
        apply(c, step)
    assert c.phase is phase
    to = TRANSITIONS[event].get(phase)
    if to is None:
        with pytest.raises(IllegalTransition, match=f"no '{event.value}' from '{phase.value}'"):
            apply(c, event)
        assert c.phase is phase  # nothing changed
    else:
        apply(c, event)
        assert c.phase is to


def test_the_architecture_table_is_the_transition_table() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## A child's lifecycle", 1)[1].split("\n## ", 1)[0]
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `([a-z ]+)` \| ([^|]+) \|", section, re.M)}
    for event, moves in TRANSITIONS.items():
        drawn = ", ".join(f"`{a.value}` → `{b.value}`" for a, b in moves.items())
        assert rows.pop(event.value).strip() == drawn, event
    assert not rows  # and nothing else


def test_a_child_stopped_while_starting_stays_stopped_when_it_says_ready() -> None:
    c = child()
    c.terminate("hung: not ready 60s after start", 5.0, 60.0, hung=True)
    c.said_ready(61.0)
    assert c.phase is Phase.STOPPING and c.ready and c.state == "draining"
    assert c.stop_order is not None and not c.stop_order.expected  # a hang's exit counts as a crash
    c.hasten(62.0)
    assert c.stop_order.kill_at == 62.0
    c.hasten(70.0)
    assert c.stop_order.kill_at == 62.0  # a deadline only comes earlier


def test_a_recycled_child_stays_not_current_while_it_drains() -> None:
    c = child()
    apply(c, Event.READY)
    c.asked_recycle("max_rss: 200MB > 100MB", 10.0)
    assert c.recycle is not None and 10.0 <= c.recycle.at <= 10.0 + RECYCLE_JITTER
    assert not c.recycling and c.snapshot(11.0, 1)["current"]
    c.give_recycle_turn()
    c.terminate("recycled (max_rss: 200MB > 100MB)", 5.0, 12.0)
    snap = c.snapshot(12.0, 1)
    assert c.recycling and not snap["current"] and snap["recycle"] == "max_rss: 200MB > 100MB"
    assert snap["stop_reason"].startswith("recycled") and snap["state"] == "draining"


def test_messages_round_trip_and_stay_under_pipe_buf() -> None:
    for message in (Ready(owner="h:1:t"), BEAT, Recycle(why="max_jobs: 10 >= 10"), Draining()):
        line = beats.encode(message)
        assert line.endswith(b"\n") and len(line) <= select.PIPE_BUF
        assert beats.decode(line[:-1]) == message
    assert beats.decode(b'{"e":"beat","state":"running","rss":1,"cpu":0,"in_flight":0,"done":0,"paused":null,'
                        b'"server":null,"server_since":null,"server_previous":null}'
                        ).cpu == 0.0  # JSON's 0 is a float field's 0.0
    # The server a child reaches, after a failover it saw (servers.ServerSeen), rides on its beat.
    moved = Beat(state=Activity.RUNNING, rss=1, cpu=0.0, in_flight=0, done=0, paused=None,
                 **Beat.server_of(ServerSeen("10.0.0.2:5432", 1765000000.123, "10.0.0.1:5432")))
    assert beats.decode(beats.encode(moved)[:-1]) == moved
    assert beats.decode(beats.encode(moved)[:-1]).server_since == 1765000000.123
    with pytest.raises(BadMessage, match="would not be written at once"):
        beats.encode(Recycle(why="x" * select.PIPE_BUF))


@pytest.mark.parametrize("line", [
    b"garbage",
    b'["ready"]',
    b'{"e":"hello"}',
    b'{"e":"ready"}',  # a field missing
    b'{"e":"ready","owner":"o","extra":1}',
    b'{"e":"ready","owner":7}',
    b'{"e":"beat","state":"dancing","rss":1,"cpu":0,"in_flight":0,"done":0,"paused":null}',
    b'{"e":"beat","state":"running","rss":true,"cpu":0,"in_flight":0,"done":0,"paused":null}',
    b'{"e":"beat","state":"running","rss":1.5,"cpu":0,"in_flight":0,"done":0,"paused":null}',
])
def test_a_bad_line_is_no_message(line: bytes) -> None:
    with pytest.raises(BadMessage):
        beats.decode(line)


def test_the_reader_takes_whole_lines_and_drops_bad_ones(caplog: pytest.LogCaptureFixture) -> None:
    reader = BeatReader("r[1] pid 1")
    data = beats.encode(Ready(owner="o")) + beats.encode(BEAT)
    assert reader.feed(data[:-10]) == [Ready(owner="o")]
    with caplog.at_level(logging.WARNING):
        assert reader.feed(data[-10:] + b"garbage\n" + beats.encode(Draining())) == [BEAT, Draining()]
    assert "r[1] pid 1: dropped a bad beat message" in caplog.text


def test_a_child_applies_what_it_says_and_drops_what_its_phase_forbids(caplog: pytest.LogCaptureFixture) -> None:
    c = child()
    assert c.feed(beats.encode(Ready(owner="o")) + beats.encode(BEAT), 2.0) == [Ready(owner="o"), BEAT]
    assert c.phase is Phase.READY and c.ready_at == 2.0 and c.last_beat == 2.0
    snap = c.snapshot(3.0, 1)
    assert (snap["state"], snap["rss"], snap["cpu"], snap["in_flight"], snap["done"], snap["paused"]) == (
        "paused", 100, 1.5, 2, 9, "host memory 90%")
    assert snap["server"] is None  # a beat that names no server (none connected yet)
    c.feed(beats.encode(replace(BEAT, server="h:5433", server_since=5.0, server_previous="h:5432")), 3.0)
    assert c.snapshot(3.0, 1)["server"] == {"address": "h:5433", "since": 5.0, "previous": "h:5432"}
    with caplog.at_level(logging.WARNING):
        assert c.feed(beats.encode(Ready(owner="o")), 4.0) == []  # said twice: the child's fault
    assert "r[1] pid 1: no 'ready' from 'ready' (the message is dropped)" in caplog.text
    assert c.phase is Phase.READY and c.ready_at == 2.0
    c.feed(beats.encode(Draining()), 5.0)
    assert c.state == "draining" and c.phase is Phase.READY  # its word; the master did not stop it


def _config(tmp_path: Path, text: str):
    path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(f"database: {{url: postgresql://x/y}}\n{text}")
    return load(path)


def test_every_kind_is_added_rolled_and_removed_by_one_diff(tmp_path: Path) -> None:
    workers = "roles:\n  w: {queues: [q], actors: [tests.sample_actors]}\n"
    plain = _config(tmp_path, workers)
    served = _config(tmp_path, workers + "http: {listen: '127.0.0.1:9191'}\n")
    read_only = _config(tmp_path, workers + "http: {listen: '127.0.0.1:9191', read_only: true}\n")
    scheduled = _config(tmp_path, workers + "http: {listen: '127.0.0.1:9191'}\n"
                        "schedules:\n  s: {cron: '* * * * *', actor: tests.sample_actors.add, queue: q}\n")
    assert diff(plain, served).added == ["http"] and diff(served, plain).removed == ["http"]
    assert diff(served, read_only).rolled == {"http": ["read_only"]}
    assert diff(served, read_only).actions() == {"http": ["roll (read_only)"]}
    assert diff(served, scheduled).rolled == {"w": ["schedules"], "http": ["schedules"]}
    # A worker role named http becomes the HTTP child: its processes are replaced.
    named = diff(_config(tmp_path, workers.replace("w:", "http:")), served)
    assert (named.added, named.removed, named.rolled) == (["w"], [], {"http": ["kind worker -> http"]})
