"""The config as frozen dataclasses, each key declared once on its field (see keys.py),
and the error every bad value raises."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..units import format_duration
from . import checks as check
from .checks import MODULE, NAME
from .http import HttpConfig
from .keys import key, section


class ConfigError(ValueError):
    """A config problem: where it is and what to do about it."""

    def __init__(self, path: str | Path, line: int | None, key: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.key = key
        self.message = message
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "line": self.line, "key": self.key, "message": self.message, "text": str(self)}


@dataclass(frozen=True)
class Problem:
    """A rule between keys that a section breaks: the key to blame and why (the reader
    adds the file and the line; ``near``: keys whose line to show when ``key`` is not written)."""

    key: str
    message: str
    near: tuple[str, ...] = ()


# --- the sections -----------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseConfig:
    url: str | None = key(check.string, "The PostgreSQL URL; `embedded` starts the bundled server.", None,
                          shown="$DATABASE_URL, else embedded", reload="restart")
    listen_url: str | None = key(check.string, "A direct connection for LISTEN when url is a transaction pooler "
                                 "(PgBouncer); unset: url itself, or no LISTEN (consumers poll) when url is pooled.",
                                 None, shown="url", reload="restart")
    read_url: str | None = key(check.string, "A standby for the dashboard's, the API's and /metrics' reads (an "
                               "operator's heavy page never costs the primary); unset or down: url.", None,
                               shown="url", reload="restart")
    pooled: bool | None = key(check.boolean, "url goes through a transaction pooler: no server-side prepared statements, "
                              "LISTEN only on listen_url.", None, shown="detected at start", reload="restart")
    storage: str | None = key(check.one_of(defaults.STORAGES, "storage"), "Where plain jobs are kept: `log` "
                              "(the append-only job log: no row updated or deleted per job; a delayed job or a retry "
                              "waits in job_timers until due; a dedupe key is held in job_keys; a job whose key carries a "
                              "concurrency limit or a fairness weight waits for a slot or a turn in job_blocked; jobs with "
                              "a rate limit or a daily quota stay in job_queue) or `table` (every job in job_queue, "
                              "the storage of earlier versions, whose workers read only job_queue). Sets "
                              "SUPERVISOR_STORAGE for the processes it starts.", None,
                              shown=f"$SUPERVISOR_STORAGE, else {defaults.STORAGE}", reload="restart")


@dataclass(frozen=True)
class SupervisorConfig:
    control_socket: Path = key(None, "The master's control socket (a relative path: to the config file's "
                               "directory).", what="path", shown="<state_dir>/supervisor.sock", reload="restart")
    state_dir: Path | None = key(None, "Local state (the embedded server's data, the default control socket).",
                                 None, what="path", shown="$SUPERVISOR_STATE_DIR, else ~/.local/state/actor-supervisor",
                                 reload="restart")
    shutdown_timeout: float = key(check.duration(0), "How long draining processes may take to finish running jobs; "
                                  "each role's default and upper bound.", defaults.SHUTDOWN_TIMEOUT, reload="live")
    watch_config: bool = key(check.boolean, "Reload when the config file is saved.", False, reload="live")
    tick: float = key(check.duration(0, strict=True), "How often the master reconciles its children and beats systemd "
                      "(at most 10s).", defaults.TICK, reload="live")
    log_level: str = key(check.log_level, "Log level of the master and its children.", "INFO", flag=("--log-level",),
                         reload="live")
    log_json: bool = key(check.boolean, "Log JSON lines (one object per event).", False, flag=("--json",), reload="live")
    job_log: bool = key(check.boolean, "One log line per finished job (written off the job's thread, in batches).",
                        True, flag=("--job-log/--no-job-log",))
    kill_grace: float = key(check.duration(0, strict=True), "A hung or overdue child gets this long after SIGTERM before "
                            "SIGKILL.", defaults.KILL_GRACE, reload="live")
    start_timeout: float = key(check.duration(0, strict=True), "A child not ready this long after its fork is treated as "
                               "hung.", defaults.START_TIMEOUT, reload="live")
    restart_backoff: float = key(check.duration(0), "Crash backoff per role: a child that died before it was ready is "
                                 "restarted after this, doubled per failure in a row.", defaults.RESTART_BACKOFF,
                                 reload="live")
    restart_backoff_max: float = key(check.duration(0), "The cap of that backoff.", defaults.RESTART_BACKOFF_MAX,
                                     reload="live")
    node_name: str | None = key(check.node_name, "This supervisor's name in owner ids, the registry, status and logs; two "
                                "supervisors on one machine with different names act as two hosts.", None,
                                shown="the host name", reload="restart")
    timezone: str = key(check.timezone, "The time zone of schedules that name none (an IANA name, e.g. "
                        "America/New_York).", defaults.SCHEDULE_TIMEZONE)

    def problems(self) -> list[Problem]:
        out = []
        if len(str(self.control_socket).encode()) > 107:
            out.append(Problem("control_socket", "path is too long for a unix socket "
                                                 f"({len(str(self.control_socket))} > 107 bytes): {self.control_socket}"))
        if self.tick > 10:
            out.append(Problem("tick", "must be at most 10s (the master reconciles and beats systemd every tick)"))
        if self.restart_backoff_max < self.restart_backoff:
            out.append(Problem("restart_backoff_max", "must not be shorter than restart_backoff"))
        return out


@dataclass(frozen=True)
class Limits:
    memory_percent: float | None = key(check.percent_or_off, "Host memory use over which a process stops claiming until "
                                       "it is back under 90% of it.", defaults.GUARD_MEMORY_PERCENT)
    cpu_percent: float | None = key(check.percent, "Host CPU use over which a process stops claiming (see ARCHITECTURE.md, "
                                    "the resource guard).", None, shown="off")
    max_rss: int | None = key(check.size(1 << 20), "A process past this resident size is recycled (rolled).", None,
                              shown="none")
    max_jobs: int | None = key(check.integer(1), "A process that has finished this many jobs is recycled (rolled).", None,
                               shown="none")


@dataclass(frozen=True)
class RoleConfig:
    name: str
    queues: tuple[str, ...] = key(check.names(NAME, "queue name"), "The queues this role's processes consume.",
                                  required=True, flag=("--queues", "-q"))
    actors: tuple[str, ...] = key(check.names(MODULE, "module name"), "The actor modules its processes import.",
                                  required=True, flag=("--actors", "-a"))
    processes: int = key(check.integer(0), "Worker processes of this role (`supervisor scale` changes it until the next "
                         "reload).", 1)
    threads: int = key(check.integer(1), "Worker threads per process.", defaults.THREADS, flag=("--threads", "-t"))
    prefetch: int | None = key(check.integer(1), "Rows a process holds claimed at most (at least threads). Unset: paced: "
                               f"threads rows, plus the rows its threads free within {defaults.PREFETCH_WAIT_SECONDS * 1000:g}"
                               f" ms at its jobs' mean run time, up to {defaults.PREFETCH_PER_THREAD} x threads.", None,
                               shown="paced", flag=("--prefetch",))
    executor: str = key(check.one_of(defaults.EXECUTORS, "executor"), "What runs the jobs: `own` (supervisor's "
                        "executor: a claimed batch goes to the threads at once, the thread that ran a job writes its "
                        "outcome) or `dramatiq` (dramatiq.Worker: its consumer thread hands over a message at a time). "
                        "Both fire every Dramatiq middleware hook alike.", defaults.EXECUTOR, flag=("--executor",))
    async_limit: int = key(check.integer(1), "Coroutines of async actors a process runs at once on its event loop, "
                           "beside its threads (executor `own`; under `dramatiq` each holds a thread).",
                           defaults.ASYNC_LIMIT, flag=("--async-limit",))
    lease: float = key(check.duration(1), "How long a claim stays valid without a heartbeat.", defaults.LEASE_SECONDS,
                       flag=("--lease",))
    heartbeat: float = key(check.duration(0, strict=True), "How often a process renews its leases (shorter than lease).",
                           defaults.HEARTBEAT_SECONDS, flag=("--heartbeat",))
    max_retries: int = key(check.integer(0), "Retries of a job whose actor raised, unless its actor's max_retries option "
                           "says otherwise.",
                           defaults.MAX_RETRIES, flag=("--max-retries",))
    min_backoff: float = key(check.duration(0), "The first retry's delay, doubled per retry (an actor's "
                             "min_backoff option wins).",
                             defaults.MIN_BACKOFF_MS / 1000, flag=("--min-backoff",))
    max_backoff: float = key(check.duration(0), "The longest retry delay (at most 1d; an actor's max_backoff "
                             "option wins).", defaults.MAX_BACKOFF_MS / 1000,
                             flag=("--max-backoff",))
    shutdown_timeout: float = key(check.duration(0), "How long a draining process lets running jobs finish (at most "
                                  "supervisor.shutdown_timeout).", defaults.SHUTDOWN_TIMEOUT,
                                  shown=f"supervisor.shutdown_timeout ({format_duration(defaults.SHUTDOWN_TIMEOUT)})",
                                  flag=("--shutdown-timeout",))
    time_limit: float | None = key(check.duration(0, strict=True), "Longest a job may run before it is interrupted "
                                   "(Dramatiq's TimeLimit).", None, shown="10m (Dramatiq's)", flag=("--time-limit",))
    # The latency of work behind a pooled URL with no listen_url, or of a lost NOTIFY.
    poll_interval: float = key(check.duration(0, strict=True), "Longest a consumer waits between claims when no wake-up "
                               "(NOTIFY) comes.", defaults.POLL_INTERVAL, flag=("--poll-interval",))
    priority: int | None = key(check.priority, "The priority (higher first) of a job sent to this role's queues without "
                               "one, where the sender knows this config: the role's workers (chains, retries, "
                               "pipelines), `supervisor enqueue`, POST /api/v1/jobs.", None, shown="0")
    limits: Limits = section(Limits, "Host-wide thresholds (stop claiming) and per-process ceilings (recycle).",
                             factory=Limits)
    line: int = field(default=0, compare=False)

    @property
    def capacity(self) -> int:
        """Rows a process of this role may hold claimed at most."""
        return defaults.capacity(self.threads, self.prefetch)

    def differences(self, other: RoleConfig) -> list[str]:
        """Names of the settings (other than line) that differ from ``other``."""
        names = [f for f in self.__dataclass_fields__ if f not in ("line", "name")]
        return [n for n in names if getattr(self, n) != getattr(other, n)]

    def problems(self, shutdown_limit: float = math.inf) -> list[Problem]:
        """The rules between its keys it breaks; ``shutdown_limit``: supervisor.shutdown_timeout."""
        out = []
        if self.heartbeat >= self.lease:
            out.append(Problem("heartbeat", f"heartbeat ({self.heartbeat:g}s) must be shorter than lease "
                                            f"({self.lease:g}s), or leases expire between beats", near=("lease",)))
        if self.shutdown_timeout > shutdown_limit:
            out.append(Problem("shutdown_timeout", f"{self.shutdown_timeout:g}s is longer than "
                               f"supervisor.shutdown_timeout ({shutdown_limit:g}s): the master would kill this "
                               "role's processes before they finish draining"))
        if self.max_backoff < self.min_backoff:
            out.append(Problem("max_backoff", f"must not be shorter than min_backoff ({self.min_backoff:g}s)"))
        if self.prefetch is not None and self.prefetch < self.threads:
            out.append(Problem("prefetch", f"must be at least threads ({self.threads})"))
        return out


def _retention(what: str, name: str) -> Any:
    return key(check.duration(0, strict=True), f"How long {what} are kept.", defaults.RETENTION[name])


@dataclass(frozen=True)
class Retention:
    """How long finished jobs (per final status), events and progress, schedule
    runs, stored results and the audit log of actions are kept, in seconds."""

    succeeded: float = _retention("succeeded jobs", "succeeded")
    failed: float = _retention("failed jobs", "failed")
    cancelled: float = _retention("cancelled jobs", "cancelled")
    events: float = _retention("job events and progress reports", "events")
    runs: float = _retention("schedule runs", "runs")
    results: float = _retention("stored results", "results")
    audit: float = _retention("audit log rows (actions taken over HTTP)", "audit")


# What becomes of a schedule's missed fires (worker/scheduler.py); none: today's, cron's.
CATCH_UP = ("none", "last", "all")


@dataclass(frozen=True)
class ScheduleConfig:
    name: str
    cron: str = key(check.cron, "When it fires: five cron fields (minute hour day month weekday; six with seconds "
                    "first), L and # as in cronsim, or @hourly, @daily ...; wall-clock times in timezone.", required=True)
    actor: str = key(check.string, "The actor it sends.", required=True)
    queue: str = key(check.string, "The queue it sends to (a role must serve it).", "default", required=True)
    args: tuple[Any, ...] = key(check.sequence, "Positional arguments of the message.", (), hash=False)
    kwargs: dict[str, Any] = key(check.mapping, "Keyword arguments of the message.", factory=dict, hash=False)
    lock_ttl_seconds: float = key(check.duration(0, strict=True), "How long one fire's lock is held (each fire runs once "
                                  "across every host).", defaults.SCHEDULE_LOCK_TTL, name="lock_ttl")
    catch_up: str = key(check.one_of(CATCH_UP, "catch_up value"), "What becomes of fires missed while no scheduler "
                        f"ran (or more than {defaults.SCHEDULE_GRACE:g}s late): none: skipped, as cron does; last: the "
                        "latest one runs; all: each runs, oldest first, one job of the schedule at a time.", "none")
    catch_up_limit: int = key(check.integer(1), "The most missed fires `all` runs at once (the latest ones; older ones "
                              "are skipped).", defaults.SCHEDULE_CATCH_UP_LIMIT)
    catch_up_window: float | None = key(check.duration(0, strict=True), "Missed fires older than this are skipped "
                                        "(last and all).", None, shown="no limit")
    timezone: str | None = key(check.timezone, "The zone its cron times are in (an IANA name); at DST changes a "
                               "fixed-time fire in the skipped hour runs right after it, one in the repeated hour "
                               "runs once.", None, shown="supervisor.timezone")


@dataclass(frozen=True)
class Config:
    path: Path
    database: DatabaseConfig = section(DatabaseConfig, "Where the database is.")
    supervisor: SupervisorConfig = section(SupervisorConfig, "The master process.")
    roles: tuple[RoleConfig, ...] = section(RoleConfig, "Each role's name and its worker processes' settings.",
                                            named="<role>", required=True)
    schedules: tuple[ScheduleConfig, ...] = section(ScheduleConfig, "Cron schedules, each fired once across every "
                                                    "host.", (), named="<schedule>")
    retention: Retention = section(Retention, "How long finished rows are kept.", factory=Retention)
    http: HttpConfig | None = section(HttpConfig, "The HTTP child: API, /metrics, dashboard (off without this "
                                      "section).", None)
    # Apps named explicitly (apps owning a role's actor modules are in use anyway).
    apps: tuple[str, ...] = key(None, "Apps in use besides those owning a role's actor modules.", (),
                                what="list of app names")
    # Sections owned by apps (e.g. the price tracker's `pipeline:`), as their parsers returned them.
    app_settings: dict[str, Any] = field(default_factory=dict, hash=False)

    def actor_modules(self) -> list[str]:
        return [m for r in self.roles for m in r.actors]

    def queue_priorities(self) -> dict[str, int]:
        """Queue -> the default priority its role gives (roles without one: absent)."""
        return {q: r.priority for r in self.roles if r.priority is not None for q in r.queues}

    @property
    def roles_by_name(self) -> dict[str, RoleConfig]:
        return {r.name: r for r in self.roles}

    def role(self, name: str) -> RoleConfig:
        return self.roles_by_name[name]
