"""The master's control commands: one handler method per command (ping, status,
reload, diff, scale, stop), plus what reload and scale need to reply once the new
state is reached. Held by the Arbiter, which it sees as a ``Master``; runs on its
loop thread only.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from .. import config as config_mod
from .. import db, servers
from ..config import Config, ConfigError, DatabaseConfig
from ..control import Connection, ControlServer
from ..identity import node_name
from ..logs import configure_logging
from .children import RoleState
from .kinds import wanted
from .reload import Diff, diff
from .systemd import Notifier
from .wakeups import Relay

log = logging.getLogger(__name__)


@dataclass
class Waiter:
    """A control client waiting for the new state (after reload or scale)."""

    conn: Connection | None
    kind: str
    changes: list[str]
    started: float
    warnings: list[str] = field(default_factory=list)


class Master(Protocol):
    """What the control commands read and change of the master (the Arbiter)."""

    config: Config
    roles: dict[str, RoleState]
    database: db.Database
    pid: int
    started: float
    stopping: bool
    notifier: Notifier
    relay: Relay | None
    control: ControlServer

    @property
    def selector(self) -> selectors.BaseSelector: ...

    def begin_stop(self, why: str, *, hard: bool = False) -> None: ...

    def set_watch(self, on: bool) -> None: ...

    def rss(self) -> int: ...


class Handlers:
    """Control commands, one ``cmd_<name>`` method each, and the clients waiting
    for the state a reload or a scale asked for."""

    def __init__(self, master: Master) -> None:
        self.master = master
        self.waiters: list[Waiter] = []
        self.ready_sent = False  # READY=1 went to systemd: every role settled once
        self.reloads = 0
        self.last_reload: dict[str, Any] | None = None
        self.config_text = read_text(master.config.path)

    # --- control socket ---------------------------------------------------------------------------

    def on_accept(self, key: selectors.SelectorKey) -> None:
        conn = self.master.control.accept()
        if conn is not None:
            fd = conn.fileno()
            self.master.selector.register(fd, selectors.EVENT_READ,
                                          lambda k, c=conn, fd=fd: self._on_request(c, fd))

    def _on_request(self, conn: Connection, fd: int) -> None:
        req = conn.read()
        if req is None and not conn.closed:
            return  # not a full line yet
        # Unregistered by number: the socket may already be closed (and the fd is not reused
        # before this line: nothing is accepted in between).
        with contextlib.suppress(KeyError, ValueError):
            self.master.selector.unregister(fd)
        if req is not None:
            self.handle(conn, req)

    def fail_waiters(self, error: str) -> None:
        for w in self.waiters:
            if w.conn:
                w.conn.reply({"ok": False, "error": error})
        self.waiters.clear()

    def waiter_fds(self) -> list[int]:
        """Clients waiting for a reload: a child must not hold them (the reply ends their connection)."""
        return [w.conn.fileno() for w in self.waiters if w.conn is not None and not w.conn.closed]

    def handle(self, conn: Connection, req: dict[str, Any]) -> None:
        cmd = str(req.get("cmd"))
        handler = getattr(self, f"cmd_{cmd}", None)
        if handler is None:
            names = ", ".join(n[4:] for n in dir(self) if n.startswith("cmd_"))
            conn.reply({"ok": False, "error": f"unknown command {cmd!r} ({names})"})
            return
        handler(conn, req)

    def cmd_ping(self, conn: Connection, req: dict[str, Any]) -> None:
        conn.reply({"ok": True, "pid": self.master.pid})

    def cmd_status(self, conn: Connection, req: dict[str, Any]) -> None:
        conn.reply({"ok": True, **self.status()})

    def cmd_reload(self, conn: Connection, req: dict[str, Any]) -> None:
        self.reload(conn, source="control socket")

    def cmd_diff(self, conn: Connection, req: dict[str, Any]) -> None:
        """What `reload` would change now (reload --dry-run); changes nothing."""
        try:
            new = config_mod.load(self.master.config.path)
        except ConfigError as exc:
            conn.reply({"ok": False, "error": str(exc), "detail": exc.as_dict()})
            return
        d = diff(self.master.config, new)
        actions = d.actions()
        targets = wanted(new)
        for name, role in self.master.roles.items():
            target = targets[name][1] if name in targets else None
            if role.override is not None and target is not None:  # `scale` holds it, not the config
                kept = [a for a in actions.get(name, []) if not a.startswith("resize ")]
                if role.override != target.processes:
                    kept.append(f"resize {role.override} -> {target.processes}")
                if kept:
                    actions[name] = kept
                else:
                    actions.pop(name, None)
        conn.reply({"ok": True, "dry_run": True, "changes": self._changes(new, d), "roles": actions})

    def cmd_scale(self, conn: Connection, req: dict[str, Any]) -> None:
        self.scale(conn, str(req.get("role")), req.get("processes"))

    def cmd_stop(self, conn: Connection, req: dict[str, Any]) -> None:
        conn.reply({"ok": True, "pid": self.master.pid, "stopping": True})
        self.master.begin_stop("stop command")

    # --- reload and scale ---------------------------------------------------------------------

    def reload(self, conn: Connection | None, *, source: str) -> None:
        now = time.monotonic()
        if self.master.stopping:
            if conn:
                conn.reply({"ok": False, "error": "the supervisor is stopping"})
            return
        text = read_text(self.master.config.path)
        try:
            new = config_mod.load(self.master.config.path)
        except ConfigError as exc:
            log.error("reload (%s) rejected, still running the previous config: %s", source, exc)
            if conn:
                conn.reply({"ok": False, "error": str(exc), "detail": exc.as_dict()})
            return
        self.config_text = text
        self.master.notifier.reloading()
        d = diff(self.master.config, new)
        changes = self._changes(new, d)
        log.info("reload (%s): %s", source, "; ".join(changes))
        self._apply(new, d)
        self.reloads += 1
        self.waiters.append(Waiter(conn, "reload", changes, now))

    def reload_if_changed(self, source: str) -> None:
        """Reload if the file's text is not what the last reload (or the start) read."""
        if read_text(self.master.config.path) != self.config_text:
            self.reload(None, source=source)

    def _changes(self, new: Config, d: Diff) -> list[str]:
        """What applying ``d`` does, one line each, including `scale` overrides it clears."""
        changes = [] if d.empty else d.lines()
        targets = wanted(new)
        for name, role in self.master.roles.items():
            target = targets[name][1] if name in targets else None
            if role.override is not None and target is not None and role.override != target.processes:
                changes.append(f"{name}: scale {role.override} cleared, back to {target.processes} from the config")
        return changes or ["no changes"]

    def _apply(self, new: Config, d: Diff) -> None:
        old_sup = self.master.config.supervisor
        # What only a restart can change stays as it is (and was reported).
        new = _replace_config(new, control_socket=old_sup.control_socket, state_dir=old_sup.state_dir,
                              database=self.master.config.database)
        if (new.supervisor.log_level, new.supervisor.log_json) != (old_sup.log_level, old_sup.log_json):
            configure_logging(new.supervisor.log_level, new.supervisor.log_json)
        self.master.config = new
        self.master.set_watch(new.supervisor.watch_config)
        roles = self.master.roles
        for name in d.removed:
            role = roles.get(name)
            if role is not None:
                role.removed = True
                role.override = None
        for name, (kind, role_cfg) in wanted(new).items():
            role = roles.get(name)
            if role is None:
                roles[name] = RoleState(role_cfg, kind)
                continue
            if role.removed or name in d.rolled:
                role.generation += 1  # every live child is now old: the role is rolled
            role.removed = False
            role.override = None  # `scale` lasts until the next reload
            role.config = role_cfg
            role.kind = kind

    def scale(self, conn: Connection | None, name: str, processes: Any) -> None:
        role = self.master.roles.get(name)
        if self.master.stopping:
            err = "the supervisor is stopping"
        elif role is None or role.removed:
            err = f"no role {name!r} (roles: {', '.join(sorted(n for n, r in self.master.roles.items() if not r.removed))})"
        elif isinstance(processes, bool) or not isinstance(processes, int) or not 0 <= processes <= 1000:
            err = f"processes must be a whole number from 0 to 1000, got {processes!r}"
        else:
            err = None
        if err or role is None:
            if conn:
                conn.reply({"ok": False, "error": err})
            return
        before = role.wanted
        role.override = processes
        change = f"{name}: scaled {before} -> {processes} (until the next reload)"
        log.info("%s", change)
        self.waiters.append(Waiter(conn, "scale", [change], time.monotonic()))

    def settle(self, now: float) -> None:
        settled = all(r.converged() or r.crash_looping for r in self.master.roles.values())
        if not self.ready_sent and settled and not self.master.stopping:
            self.ready_sent = True
            self.master.notifier.ready(self.status_line())
            log.info("ready: %s", self.status_line())
        if not self.waiters or not settled:
            return
        warnings = [f"{r.name} is crash-looping: {r.last_exit}" for r in self.master.roles.values() if r.crash_looping]
        reloaded = any(w.kind == "reload" for w in self.waiters)
        for w in self.waiters:
            result = {"ok": True, "kind": w.kind, "changes": w.changes, "warnings": warnings,
                      "seconds": round(now - w.started, 3)}
            if w.kind == "reload":
                self.last_reload = {**result, "at": time.time()}
            if w.conn:
                w.conn.reply(result)
        self.waiters.clear()
        if reloaded and self.ready_sent:
            self.master.notifier.ready(self.status_line())

    # --- status and systemd ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        roles = []
        for role in self.master.roles.values():
            roles.append({
                "name": role.name,
                "wanted": role.wanted,
                "running": len(role.ready_current()),
                "state": role.state(now),
                "scaled": role.override is not None,
                "queues": list(role.config.queues),
                "threads": role.config.threads,
                "restarts": role.restarts,
                "last_exit": role.last_exit,
                "last_exit_ago": round(now - role.last_exit_at, 1) if role.last_exit_at else None,
                "next_restart_in": round(role.next_start - now, 1) if role.next_start > now else None,
                "processes": [c.snapshot(now, role.generation)
                              for c in sorted(role.children.values(), key=lambda c: (c.slot, c.forked_at))],
            })
        state = "stopping" if self.master.stopping else ("reloading" if self.waiters else
                                                  ("running" if self.ready_sent else "starting"))
        return {
            "node": node_name(),
            "pid": self.master.pid,
            "state": state,
            "uptime": round(now - self.master.started, 1),
            "rss": self.master.rss(),
            "config": str(self.master.config.path),
            "control_socket": str(self.master.config.supervisor.control_socket),
            "database": db.redact(self.master.database.url),
            "pooled": self.master.database.pooled,
            # The server the master's connections reach now, and the one before (a failover).
            "server": asdict(seen) if (seen := servers.server_seen(self.master.database.url)) else None,
            # One LISTEN connection for the host, relayed to the children; else they poll.
            "wakeups": "relayed" if self.master.relay is not None else "polling",
            "reloads": self.reloads,
            "last_reload": self.last_reload,
            "roles": roles,
        }

    def status_line(self) -> str:
        parts = []
        for role in self.master.roles.values():
            part = f"{role.name} {len(role.ready_current())}/{role.wanted}"
            if role.crash_looping:
                part += " crash-looping"
            parts.append(part)
        return ", ".join(parts) or "no roles"


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _replace_config(cfg: Config, *, control_socket: Path, state_dir: Path | None,
                    database: DatabaseConfig) -> Config:
    return replace(cfg, database=database,
                   supervisor=replace(cfg.supervisor, control_socket=control_socket, state_dir=state_dir))


