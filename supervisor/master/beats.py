"""The beat pipe's messages, typed on both ends: the child writes them with a
``Beacon``, the master reads them with a ``BeatReader``.

One JSON object a line, ``{"e": <tag>, <the message's fields>}``; a line stays
under PIPE_BUF, so a write is atomic and the master never sees half of one. A
line that is not a whole, well-formed message is dropped with a warning: it
comes from a child, and nothing a child writes may stop the master.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, get_type_hints

from ..servers import ServerSeen

log = logging.getLogger(__name__)


class Activity(StrEnum):
    """What a child says it is doing (a worker's own state; the HTTP child only runs)."""

    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"  # the resource guard holds its claims
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Ready:
    """The child serves: a worker claims, the HTTP child listens."""

    TAG: ClassVar[str] = "ready"
    owner: str


@dataclass(frozen=True)
class Beat:
    """Every beat interval: alive, and what it is doing (the master's hang check and `status`)."""

    TAG: ClassVar[str] = "beat"
    state: Activity
    rss: int
    cpu: float
    in_flight: int
    done: int
    paused: str | None  # why it does not claim, if it does not
    # The database server its connections reach (servers.ServerSeen: host:port, and after a
    # change it saw, since when and the one before): `status` and the Overview per process.
    server: str | None = None
    server_since: float | None = None
    server_previous: str | None = None

    @staticmethod
    def server_of(seen: ServerSeen | None) -> dict[str, Any]:
        """A Beat's server fields, from what the child's pools saw of its URL."""
        if seen is None:
            return {}
        return {"server": seen.address, "server_since": round(seen.since, 3), "server_previous": seen.previous}


@dataclass(frozen=True)
class Recycle:
    """The child asks to be replaced (max_rss, max_jobs); the master chooses when."""

    TAG: ClassVar[str] = "recycle"
    why: str


@dataclass(frozen=True)
class Draining:
    """The child is draining (told to stop, or its master went away)."""

    TAG: ClassVar[str] = "draining"


Message = Ready | Beat | Recycle | Draining
MESSAGES: dict[str, type[Message]] = {cls.TAG: cls for cls in (Ready, Beat, Recycle, Draining)}
# Each message's fields: name -> type (its TAG is no field).
_FIELDS = {cls: {f.name: get_type_hints(cls)[f.name] for f in fields(cls)} for cls in MESSAGES.values()}


class BadMessage(ValueError):
    """A line that is no message of MESSAGES."""


def encode(message: Message) -> bytes:
    line = json.dumps({"e": message.TAG, **asdict(message)}, separators=(",", ":")).encode() + b"\n"
    if len(line) > select.PIPE_BUF:
        raise BadMessage(f"a {message.TAG} message of {len(line)} bytes would not be written at once")
    return line


def _field(cls: type[Message], name: str, kind: Any, value: Any) -> Any:
    """``value`` as the field's type, or BadMessage. The types used by MESSAGES only."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int and number and isinstance(value, int):
        return int(value)
    if kind is float and number:
        return float(value)
    if kind in (str, str | None) and isinstance(value, str):
        return str(value)
    if kind in (str | None, float | None) and value is None:
        return None
    if kind == (float | None) and number:
        return float(value)
    if kind is Activity and value in {a.value for a in Activity}:
        return Activity(value)
    raise BadMessage(f"{cls.TAG}.{name}: {value!r} is no {kind}")


def decode(line: bytes) -> Message:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise BadMessage(f"not JSON: {line[:80]!r}") from exc
    if not isinstance(data, dict) or data.get("e") not in MESSAGES:
        raise BadMessage(f"no message tag: {line[:80]!r}")
    cls = MESSAGES[data.pop("e")]
    types = _FIELDS[cls]
    if data.keys() != types.keys():
        raise BadMessage(f"{cls.TAG}: fields {sorted(data)}, expected {sorted(types)}")
    return cls(**{name: _field(cls, name, kind, data[name]) for name, kind in types.items()})


class BeatReader:
    """The master's end: bytes as they come off the pipe in, whole messages out."""

    def __init__(self, name: str) -> None:
        self.name = name  # for the warning about a bad line
        self.buffer = b""

    def feed(self, data: bytes) -> list[Message]:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(decode(line))
            except BadMessage as exc:
                log.warning("%s: dropped a bad beat message: %s", self.name, exc)
        return out


class Beacon:
    """The child's end. Writes never block: a full pipe (the master is busy) drops
    a message; a broken pipe means the master is gone."""

    def __init__(self, fd: int, on_master_gone: Callable[[str], None]) -> None:
        self.fd = fd
        self.on_master_gone = on_master_gone
        os.set_blocking(fd, False)

    def send(self, message: Message) -> None:
        try:
            os.write(self.fd, encode(message))
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                self.on_master_gone("beat pipe closed")
            else:
                raise
