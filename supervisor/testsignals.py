"""Typed events a test awaits instead of reading log lines (as River's testSignals).

Off in production: ``emit`` returns at once unless the environment names a file
(``SUPERVISOR_TEST_SIGNALS``, set by a test harness for the processes it starts and
inherited by the children a master forks). Then each event is one JSON line appended
to that file, and ``Recorded`` reads the lines back as the same typed events, in the
order they were emitted. Components emit; nothing in the product reads them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ENV = "SUPERVISOR_TEST_SIGNALS"


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A consumer's claim returned ``took`` of the ``asked`` rows of ``queue`` (none, too)."""

    queue: str
    took: int
    asked: int


@dataclasses.dataclass(frozen=True)
class ClaimsFailing:
    """A consumer's claims from ``queue`` began to fail (the database is away)."""

    queue: str


@dataclasses.dataclass(frozen=True)
class ClaimsBack:
    """A consumer claims from ``queue`` again after its claims had failed."""

    queue: str


@dataclasses.dataclass(frozen=True)
class Interrupted:
    """The fence interrupted an attempt of a job while it ran (``reason``: lease lost, cancelled)."""

    job_id: str
    attempt: int
    reason: str


Signal = Claimed | ClaimsFailing | ClaimsBack | Interrupted
KINDS: dict[str, type[Any]] = {k.__name__: k for k in (Claimed, ClaimsFailing, ClaimsBack, Interrupted)}
S = TypeVar("S", Claimed, ClaimsFailing, ClaimsBack, Interrupted)

_path = os.environ.get(ENV) or None
# Whether this process records: a component on a job's path asks before it builds a signal,
# so a process no test watches pays one attribute read, not a call.
recording = _path is not None


def emit(signal: Signal) -> None:
    """Record ``signal`` where the test harness asked; nothing at all when it did not."""
    if _path is None:
        return
    line = json.dumps({"signal": type(signal).__name__, **dataclasses.asdict(signal)}) + "\n"
    # One write of one line to a file opened for appending: the lines of a process's
    # threads, and of the processes sharing the file, never interleave. A file gone
    # (its test ended) must not change what the process does.
    with contextlib.suppress(OSError):
        fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class Recorded:
    """The signals the processes given ``env`` have emitted so far (a test's side)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def env(self) -> dict[str, str]:
        """The environment a process needs to emit here."""
        return {ENV: str(self.path)}

    def all(self) -> list[Signal]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        out: list[Signal] = []
        for line in text.splitlines(keepends=True):
            if line.endswith("\n"):  # a line being written is read next time
                fields = json.loads(line)
                out.append(KINDS[fields.pop("signal")](**fields))
        return out

    def of(self, kind: type[S], where: Callable[[S], bool] = lambda _: True) -> list[S]:
        """The signals of one kind (that ``where`` accepts), in the order emitted."""
        return [s for s in self.all() if isinstance(s, kind) and where(s)]

    def wait(self, kind: type[S], where: Callable[[S], bool] = lambda _: True, *, count: int = 1,
             timeout: float = 10.0) -> list[S]:
        """Until ``count`` signals of ``kind`` that ``where`` accepts have been emitted;
        returns them all. AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while len(found := self.of(kind, where)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {count} {kind.__name__} signal(s);"
                                     f" {len(found)} came")
            time.sleep(0.01)  # the file is written by other processes: nothing here to wait on
        return found
