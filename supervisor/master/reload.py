"""What a reload changes: the diff between the running config and the new file.

Pure data in, data out; the arbiter applies it. Settings the running master
cannot change in place (where the database is, where the control socket is)
are reported as needing a restart instead of being half-applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import Config, DatabaseConfig, SupervisorConfig
from ..config.keys import declared
from .kinds import KINDS, wanted

# Supervisor settings the master picks up on reload, and those only a restart applies:
# as each key declares (its `reload`).
LIVE_SUPERVISOR_KEYS = tuple(k.field for k in declared(SupervisorConfig) if k.reload == "live")
RESTART_SUPERVISOR_KEYS = tuple(k.field for k in declared(SupervisorConfig) if k.reload == "restart")
RESTART_DATABASE_KEYS = tuple(k.field for k in declared(DatabaseConfig) if k.reload == "restart")


@dataclass
class Diff:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    resized: dict[str, tuple[int, int]] = field(default_factory=dict)
    rolled: dict[str, list[str]] = field(default_factory=dict)  # role -> what changed
    supervisor: list[str] = field(default_factory=list)
    needs_restart: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.resized or self.rolled or self.supervisor
                    or self.needs_restart)

    def lines(self) -> list[str]:
        out = [f"{name}: added" for name in self.added]
        out += [f"{name}: removed (draining)" for name in self.removed]
        for name, fields in self.rolled.items():
            out.append(f"{name}: rolled ({', '.join(fields)})")
        for name, (a, b) in self.resized.items():
            out.append(f"{name}: resized {a} -> {b}")
        out += self.supervisor
        out += [f"{what}: changed, but only a restart applies it" for what in self.needs_restart]
        return out or ["no changes"]

    def actions(self) -> dict[str, list[str]]:
        """Per role, what a reload does to it: start, drain, roll (with why), resize."""
        out: dict[str, list[str]] = {name: ["start"] for name in self.added}
        for name in self.removed:
            out[name] = ["drain"]
        for name, fields in self.rolled.items():
            out.setdefault(name, []).append(f"roll ({', '.join(fields)})")
        for name, (a, b) in self.resized.items():
            out.setdefault(name, []).append(f"resize {a} -> {b}")
        return out


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def diff(old: Config, new: Config) -> Diff:
    d = Diff()
    old_roles, new_roles = wanted(old), wanted(new)
    changed = {kind.name: kind.changed(old, new) for kind in KINDS}
    for name, (kind, role) in new_roles.items():
        if name not in old_roles:
            d.added.append(name)
            continue
        was, before = old_roles[name]
        if was is not kind:
            d.rolled[name] = [f"kind {was.name} -> {kind.name}"]
        else:
            fields = [f for f in before.differences(role) if f != "processes"]
            what = [f"{f} {_show(getattr(before, f))} -> {_show(getattr(role, f))}" for f in fields if f != "limits"]
            if "limits" in fields:
                what.append("limits")
            if what + changed[kind.name]:
                d.rolled[name] = what + changed[kind.name]
        if before.processes != role.processes:
            d.resized[name] = (before.processes, role.processes)
    d.removed = [name for name in old_roles if name not in new_roles]
    for key in LIVE_SUPERVISOR_KEYS:
        a, b = getattr(old.supervisor, key), getattr(new.supervisor, key)
        if a != b:
            d.supervisor.append(f"supervisor.{key}: {_show(a)} -> {_show(b)}")
    for key in RESTART_SUPERVISOR_KEYS:
        if getattr(old.supervisor, key) != getattr(new.supervisor, key):
            d.needs_restart.append(f"supervisor.{key}")
    for key in RESTART_DATABASE_KEYS:
        if getattr(old.database, key) != getattr(new.database, key):
            d.needs_restart.append(f"database.{key}")
    return d
