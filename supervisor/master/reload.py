"""What a reload changes: the diff between the running config and the new file.

Pure data in, data out; the arbiter applies it. Settings the running master
cannot change in place (where the database is, where the control socket is)
are reported as needing a restart instead of being half-applied.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .. import apps
from ..config import Config, DatabaseConfig, HttpConfig, SupervisorConfig
from ..config.keys import declared

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
    http: str | None = None  # what a reload does to the HTTP child
    needs_restart: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.resized or self.rolled or self.supervisor
                    or self.http or self.needs_restart)

    def lines(self) -> list[str]:
        out = [f"{name}: added" for name in self.added]
        out += [f"{name}: removed (draining)" for name in self.removed]
        for name, fields in self.rolled.items():
            out.append(f"{name}: rolled ({', '.join(fields)})")
        for name, (a, b) in self.resized.items():
            out.append(f"{name}: resized {a} -> {b}")
        out += self.supervisor
        if self.http:
            out.append(f"http: {self.http}")
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


def _show(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _http_change(old: Config, new: Config) -> str | None:
    """What a reload does to the HTTP child: started, stopped, rolled (it reads the
    http section, lists the schedules, and shows the pages of the apps in use), or nothing."""
    if old.http is None or new.http is None:
        return None if old.http == new.http else ("started" if old.http is None else "stopped")
    changed = [f.name for f in dataclasses.fields(HttpConfig) if getattr(old.http, f.name) != getattr(new.http, f.name)]
    if old.schedules != new.schedules:
        changed.append("schedules")
    if {a.name for a in apps.used_by(old)} != {a.name for a in apps.used_by(new)}:
        changed.append("apps")
    return f"rolled ({', '.join(changed)})" if changed else None


def diff(old: Config, new: Config) -> Diff:
    d = Diff()
    old_roles, new_roles = old.roles_by_name, new.roles_by_name
    everywhere = []
    if old.schedules != new.schedules:
        everywhere.append("schedules")
    if old.retention != new.retention:
        everywhere.append("retention")
    for name in sorted(set(old.app_settings) | set(new.app_settings)):
        if old.app_settings.get(name) != new.app_settings.get(name):
            everywhere.append(name)  # apps read their sections at boot
    for name, role in new_roles.items():
        before = old_roles.get(name)
        if before is None:
            d.added.append(name)
            continue
        changed = [f for f in before.differences(role) if f != "processes"]
        what = [f"{f} {_show(getattr(before, f))} -> {_show(getattr(role, f))}" for f in changed if f != "limits"]
        if "limits" in changed:
            what.append("limits")
        what += everywhere
        if what:
            d.rolled[name] = what
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
    d.http = _http_change(old, new)
    for key in RESTART_DATABASE_KEYS:
        if getattr(old.database, key) != getattr(new.database, key):
            d.needs_restart.append(f"database.{key}")
    return d
