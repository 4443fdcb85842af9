"""The master process: fork, reap, reconcile, reload, signals, sd_notify.

One thread runs everything here around a selector: the self-pipe (signals and
wake-ups from other threads), the control socket and one beat pipe per child.
It never blocks on the database: what must be written (releasing a dead
child's leases, the registry rows) goes to the janitor thread.

Forks happen only from this (main) thread, which lives as long as the master:
PR_SET_PDEATHSIG in the children fires when the forking thread exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import time

import psutil

from .. import db, defaults, exit_codes
from ..config import Config
from ..control import AlreadyRunning, ControlServer
from ..identity import new_token, node_name, owner_id
from .beats import Ready, Recycle
from .bootstrap import ChildSpec
from .children import RoleState, describe_exit, plan, silent_limits, spawn
from .handlers import Handlers
from .janitor import Janitor
from .kinds import wanted
from .lifecycle import SERVING, Child, Phase
from .metrics_dir import MetricsDir
from .proctitle import MASTER_TITLE, set_title
from .systemd import Notifier
from .wakeups import Relay
from .watcher import CONFIG_CHANGED, WAKE, ConfigWatcher, poke

log = logging.getLogger(__name__)


class Arbiter:
    def __init__(self, cfg: Config, database: db.Database) -> None:
        self.config = cfg
        self.database = database
        self.url = database.url
        self.pid = os.getpid()
        self.owner = owner_id(self.pid)
        self.roles: dict[str, RoleState] = {}
        self.selector = selectors.DefaultSelector()
        self.notifier = Notifier()
        self.control = ControlServer(cfg.supervisor.control_socket)
        self.janitor: Janitor | None = None
        self.relay: Relay | None = None
        self.watcher: ConfigWatcher | None = None
        self.stopping = False
        self.stop_deadline: float | None = None
        self.started = time.monotonic()
        self.handlers = Handlers(self)  # the control commands; reload and scale
        self._wake_r = self._wake_w = -1
        self._signals: list[int] = []
        self._next_master_beat = 0.0
        self._proc = psutil.Process()
        self.metrics_dir = MetricsDir()

    # --- setup and teardown --------------------------------------------------------

    def _setup(self) -> None:
        set_title(MASTER_TITLE)
        self.control.open()
        self.metrics_dir.open()  # before the first fork: every child inherits it
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._on_wake)
        self.selector.register(self.control.fileno(), selectors.EVENT_READ, self.handlers.on_accept)
        # The handler only notes the signal (it runs in this thread, between bytecodes);
        # the wakeup fd makes select() return so the loop acts on it at once.
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: self._signals.append(signum))
        queues = sorted({q for r in self.config.roles for q in r.queues})
        self.janitor = Janitor(self.url, self.owner, queues=queues, on_done=self._wake_loop)
        self.janitor.start()
        self.janitor.register_master()
        # Before the first fork, so no child of ours can be mistaken for an orphan. Bounded:
        # if the database is slow, the children's reapers recover by lease expiry instead.
        self.janitor.submit("recover orphans", self.janitor.recover_orphans, retry_for=5.0)
        if not self.janitor.idle.wait(10.0):
            log.warning("orphan recovery is still waiting for the database; starting the roles anyway")
        if self.database.listen_url and self.config.roles:
            self.relay = Relay(self.database.listen_url)
            self.relay.start()
        for name, (kind, role_cfg) in wanted(self.config).items():
            self.roles[name] = RoleState(role_cfg, kind)
        self.set_watch(self.config.supervisor.watch_config)
        self.notifier.status("starting")
        log.info("master %d up: node %s, %d role(s), control socket %s, database %s%s", self.pid, node_name(),
                 len(self.roles), self.config.supervisor.control_socket, db.redact(self.url),
                 " (pooled)" if self.database.pooled else "")

    def _teardown(self) -> None:
        self.set_watch(False)
        self.handlers.fail_waiters("the supervisor stopped before the new state was reached")
        if self.relay is not None:
            self.relay.stop()
            self.relay.close_all()
        if self.janitor is not None:
            self.janitor.mark_stopped(self.owner, "stopped")
            if not self.janitor.stop(timeout=5.0):
                log.warning("janitor did not finish in 5s; any lease it could not release expires on its own")
        self.control.close()
        signal.set_wakeup_fd(-1)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.notifier.drain(1.0)
        self.notifier.close()
        self.metrics_dir.close()

    def set_watch(self, on: bool) -> None:
        if on and self.watcher is None:
            self.watcher = ConfigWatcher(self.config.path, self._wake_w)
            self.watcher.start()
        elif not on and self.watcher is not None:
            self.watcher.stop()
            self.watcher = None

    def _wake_loop(self) -> None:
        poke(self._wake_w, WAKE)

    def rss(self) -> int:
        return int(self._proc.memory_info().rss)

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self._setup()
        except AlreadyRunning as exc:
            log.error("%s", exc)
            return exit_codes.PROBLEM
        try:
            while True:
                now = time.monotonic()
                for key, _ in self.selector.select(self._timeout(now)):
                    key.data(key)
                self._handle_signals()
                now = time.monotonic()
                self._reap(now)
                self._watch_children(now)
                if not self.stopping:
                    self._reconcile(now)
                self.handlers.settle(now)
                self._housekeeping(now)
                if self.stopping and not any(r.children for r in self.roles.values()):
                    break
        finally:
            self._teardown()
        log.info("master %d stopped", self.pid)
        return exit_codes.OK

    def _timeout(self, now: float) -> float:
        timeout = self.config.supervisor.tick
        for role in self.roles.values():
            if role.next_start > now and len(role.live()) < role.wanted:
                timeout = min(timeout, role.next_start - now)
            for c in role.children.values():
                if c.phase is Phase.STOPPING and c.stop_order is not None:
                    timeout = min(timeout, c.stop_order.kill_at - now)
        return max(timeout, 0.005)

    def _on_wake(self, key: selectors.SelectorKey) -> None:
        try:
            data = os.read(self._wake_r, 65536)
        except BlockingIOError:
            return
        # Signal numbers in here are only wake-ups: self._signals has them, even if
        # a full pipe dropped the byte.
        # A change noted just before watching was turned off is not applied: only a
        # watcher still running speaks for the file.
        if CONFIG_CHANGED in data and self.watcher is not None:
            self.handlers.reload_if_changed("config file change")

    def _handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if sig in (signal.SIGTERM, signal.SIGINT):
                self.begin_stop(signal.Signals(sig).name, hard=self.stopping and sig == signal.SIGINT)
            elif sig == signal.SIGHUP:
                self.handlers.reload(None, source="SIGHUP")

    # --- children -------------------------------------------------------------------------

    def _fds_to_close(self) -> list[int]:
        fds = [self._wake_r, self._wake_w, self.control.fileno()]
        with contextlib.suppress(Exception):
            fds.append(self.selector.fileno())
        for key in list(self.selector.get_map().values()):
            fds.append(key.fd)
        fds += self.handlers.waiter_fds()
        fds += self.notifier.fds()
        if self.relay is not None:
            fds += self.relay.fds()  # or a sibling would keep another child's pipe open
        return sorted(set(fds))

    def _spawn(self, role: RoleState, now: float) -> Child:
        sup = self.config.supervisor
        spec = ChildSpec(role=role.name, slot=role.free_slot(), database=self.database, token=new_token(),
                         master_pid=self.pid, beat_interval=min(1.0, sup.tick, role.config.heartbeat),
                         log_level=sup.log_level, log_json=sup.log_json)
        bootstrap = role.kind.bootstrap(spec, self._fds_to_close(), self.config)
        child = spawn(role, bootstrap, now, wakeups=self.relay is not None and role.kind.relayed_wakeups)
        if self.relay is not None and child.wake_fd >= 0:
            self.relay.add(child.pid, child.wake_fd)
        role.children[child.pid] = child
        self.selector.register(child.fd, selectors.EVENT_READ, lambda key, c=child: self._on_beat(c))
        log.info("started %s (generation %d)", child.name, child.generation)
        return child

    def _on_beat(self, child: Child) -> None:
        try:
            data = os.read(child.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        now = time.monotonic()
        if not data:
            self._forget_fd(child)
            return
        for message in child.feed(data, now):
            if isinstance(message, Ready):
                log.info("%s ready in %.2fs", child.name, now - child.forked_at)
            elif isinstance(message, Recycle):
                log.info("%s asks to be recycled (%s)", child.name, message.why)

    def _forget_fd(self, child: Child) -> None:
        if child.fd >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(child.fd)
            with contextlib.suppress(OSError):
                os.close(child.fd)
            child.fd = -1

    def _find(self, pid: int) -> tuple[RoleState, Child] | None:
        for role in self.roles.values():
            if pid in role.children:
                return role, role.children[pid]
        return None

    def _reap(self, now: float) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            found = self._find(pid)
            if found is None:
                continue
            role, child = found
            if child.fd >= 0:  # read what it said last (a final beat or a recycle request)
                self._on_beat(child)
                self._forget_fd(child)
            killed = child.phase is Phase.KILLED
            child.reaped()
            del role.children[pid]
            if self.relay is not None:
                self.relay.remove(pid)
            self.metrics_dir.mark_dead(pid)
            how = describe_exit(status)
            order = child.stop_order
            expected = order is not None and order.expected
            reason = f"{order.reason}; {how}" if order else how
            clean = expected and how == "exited 0"
            assert self.janitor is not None
            self.janitor.release(child.owner, f"{role.name} process {pid} {how}", lease_seconds=role.config.lease)
            if not clean:
                self.janitor.mark_stopped(child.owner, "killed" if killed else "crashed")
            role.record_exit(child, reason, expected, now, self.config.supervisor.restart_backoff,
                             self.config.supervisor.restart_backoff_max)
            (log.info if expected else log.warning)(
                "%s[%d] pid %d ended after %.1fs: %s", role.name, child.slot, pid, now - child.forked_at, reason)
            if role.removed and not role.children:
                del self.roles[role.name]

    def _terminate(self, child: Child, reason: str, grace: float, now: float, *, hung: bool = False) -> None:
        child.terminate(reason, grace, now, hung=hung)
        log.info("stopping %s: %s", child.name, reason)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)

    def _kill(self, child: Child, why: str) -> None:
        child.kill()
        log.warning("killing %s: %s", child.name, why)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)

    def _watch_children(self, now: float) -> None:
        sup = self.config.supervisor
        for role in self.roles.values():
            # A silent child is killed before its leases can expire: else another process
            # would reclaim its jobs while it (frozen, not dead) may wake and run them too.
            hang_after, hang_grace = silent_limits(role.config.lease, role.config.heartbeat,
                                                   min(1.0, sup.tick, role.config.heartbeat), sup.kill_grace)
            recycling = any(c.recycling for c in role.live())
            for c in list(role.children.values()):
                order = c.stop_order
                if c.phase is Phase.STOPPING and order is not None and now >= order.kill_at:
                    self._kill(c, f"still running {now - order.term_at:.1f}s after SIGTERM ({order.reason})")
                elif c.phase is Phase.STARTING and now - c.forked_at > sup.start_timeout:
                    self._terminate(c, f"hung: not ready {sup.start_timeout:g}s after start", sup.kill_grace, now,
                                    hung=True)
                elif c.phase in SERVING and now - c.last_beat > hang_after:
                    self._terminate(c, f"hung: no beat for {now - c.last_beat:.1f}s", hang_grace, now, hung=True)
                elif (c.phase is Phase.RECYCLE_ASKED and c.recycle is not None and now >= c.recycle.at
                      and not recycling and not self.stopping and all(role.is_current(o) for o in role.live())):
                    # One recycle per role at a time, and not during a roll.
                    c.give_recycle_turn()
                    recycling = True

    def _reconcile(self, now: float) -> None:
        sup = self.config.supervisor
        for role in list(self.roles.values()):
            role.settle_streak(now)
            start, drains = plan(role, now)
            for child, why in drains:
                self._terminate(child, why, role.config.shutdown_timeout + sup.kill_grace, now)
            for _ in range(start):
                self._spawn(role, now)

    # --- stop -------------------------------------------------------------------------------

    def begin_stop(self, why: str, *, hard: bool = False) -> None:
        now = time.monotonic()
        if self.stopping:
            if hard:
                for role in self.roles.values():
                    for c in role.children.values():
                        if c.phase is Phase.STOPPING:
                            self._kill(c, "second interrupt")
            return
        sup = self.config.supervisor
        self.stopping = True
        self.stop_deadline = now + sup.shutdown_timeout
        log.info("stopping (%s): draining every role, up to %gs", why, sup.shutdown_timeout)
        self.notifier.stopping()
        self.notifier.status(f"stopping ({why})")
        self.set_watch(False)
        for role in self.roles.values():
            for c in role.children.values():
                if not c.stopping:
                    self._terminate(c, "shutdown", sup.shutdown_timeout, now)
                elif c.phase is Phase.STOPPING:
                    c.hasten(self.stop_deadline)
        self.handlers.fail_waiters("the supervisor is stopping")

    def _housekeeping(self, now: float) -> None:
        self.notifier.flush()
        self.notifier.watchdog(now)
        if self.handlers.ready_sent and not self.stopping:
            self.notifier.status(self.handlers.status_line())
        if now >= self._next_master_beat and self.janitor is not None and self.janitor.idle.is_set():
            self._next_master_beat = now + defaults.MASTER_BEAT_SECONDS
            self.janitor.beat_master("stopping" if self.stopping else "running")


