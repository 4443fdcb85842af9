"""No process outlives the test that started it.

A worker, a master or a CLI that a test started and did not stop keeps claiming from the
test process's database: the next tests on that xdist worker then lose their jobs to it,
and fail far from the cause (one CI run saw 11 failures in a row on one worker). So after
each test's teardown, every process it started while its body ran (its fixtures' own are
their teardown's business), and every session still open on the test database from a
process that is no longer ours (a worker whose master was killed and that did not follow),
gets a grace to end by itself (a killed master's children notice within a beat), then is
killed, and the test that left it errs with its command line.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator

import psutil
import psycopg
import pytest

# A child of a killed master sees its parent gone at its next check (a second or so) and
# drains; a stopped worker may be finishing a job of a few seconds.
GRACE_SECONDS = 15.0
_STARTED = pytest.StashKey[float]()
_PID_IN_NAME = re.compile(r":(\d+)$")  # db.session_kwargs: "<name> <node>:<pid>"


def _ours(proc: psutil.Process) -> bool:
    """Whether ``proc`` descends from this test process."""
    me = os.getpid()
    try:
        return any(p.pid == me for p in proc.parents())
    except psutil.Error:
        return False


def _started_by_body(proc: psutil.Process, since: float) -> bool:
    """Whether ``proc`` and each of its ancestors below this process began after ``since``:
    a renderer a session's browser opens for a new page is the browser's, not the test's."""
    me = os.getpid()
    try:
        for p in [proc, *proc.parents()]:
            if p.pid == me:
                return True
            if p.create_time() < since:
                return False
    except psutil.Error:
        return False
    return False


def _orphans_on_database() -> list[psutil.Process]:
    """Processes of this machine holding a session on the test database that no longer
    descend from this test process (their parent was killed or let them go)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        return []
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as c:
            names = [r[0] for r in c.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()")]
    except psycopg.Error:
        return []
    found: dict[int, psutil.Process] = {}
    for name in names:
        m = _PID_IN_NAME.search(name or "")
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            proc = psutil.Process(int(m.group(1)))
        except psutil.Error:
            continue
        if not _ours(proc):
            found[proc.pid] = proc
    return list(found.values())


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:160]}"
    except psutil.Error:
        return str(p.pid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    item.stash[_STARTED] = time.time()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    started = item.stash.get(_STARTED, None)
    if started is None:
        return
    body = [p for p in psutil.Process().children(recursive=True) if _started_by_body(p, started - 0.05)]
    suspects = {p.pid: p for p in [*body, *_orphans_on_database()]}
    left = _alive(list(suspects.values()))
    if not left:
        return
    deadline = time.monotonic() + GRACE_SECONDS
    while left and time.monotonic() < deadline:
        _, left = psutil.wait_procs(left, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        left = _alive(left)
    if not left:
        return
    described = [_describe(p) for p in left]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=5)
    pytest.fail(f"{item.nodeid} left {len(described)} process(es) running {GRACE_SECONDS:.0f} s after its"
                f" teardown (killed now): {'; '.join(described)}", pytrace=False)
