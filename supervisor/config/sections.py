"""The YAML config: parsed into frozen, validated dataclasses.

Every error names the file, the line and the dotted key, because the person
reading it is editing that file (often through `supervisor reload`). The node
tree from ``yaml.compose`` keeps line numbers that plain ``safe_load`` throws away.

Relative paths (``control_socket``, ``state_dir``) are relative to the config
file's directory, so the master and every CLI client agree on them whatever
their working directory.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

from .. import apps, defaults
from ..cron import parse as cron_parse
from ..units import parse_size
from . import model
from .http import ROLES, SINGLE_TOKEN_NAME, HttpConfig, HttpToken
from .model import (
    Config,
    ConfigError,
    DatabaseConfig,
    Limits,
    RoleConfig,
    ScheduleConfig,
    SupervisorConfig,
)
from .reader import (
    MODULE,
    NAME,
    Item,
    Reader,
    Section,
    boolean,
    duration,
    integer,
    kind,
    names,
    percent,
    plain,
    string,
)

DEFAULT_PATH = Path("config/supervisor.yaml")
ENV_PATH = "SUPERVISOR_CONFIG"


# --- finding the file --------------------------------------------------------------


def find_path(explicit: str | Path | None = None) -> Path:
    """-c/--config, else $SUPERVISOR_CONFIG, else config/supervisor.yaml."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_PATH)
    if env:
        return Path(env)
    return DEFAULT_PATH


def load(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(path, None, None, f"cannot read the config file: {exc.strerror or exc}") from exc
    return parse(text, path, env=env)


# --- sections -------------------------------------------------------------------------------

_TOP = ("database", "supervisor", "roles", "schedules", "retention", "http", "apps")
_SUPERVISOR = ("control_socket", "state_dir", "shutdown_timeout", "watch_config", "tick", "log_level",
               "log_json", "job_log", "kill_grace", "start_timeout", "restart_backoff", "restart_backoff_max", "node_name")
_ROLE = ("processes", "threads", "prefetch", "queues", "actors", "lease", "heartbeat", "max_retries", "min_backoff",
         "max_backoff", "shutdown_timeout", "time_limit", "poll_interval", "priority", "limits")
_LIMITS = ("memory_percent", "cpu_percent", "max_rss", "max_jobs")
_SCHEDULE = ("cron", "actor", "queue", "args", "kwargs", "lock_ttl")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse(text: str, path: str | Path = "<config>", env: Mapping[str, str] | None = None) -> Config:
    path = Path(path)
    reader = Reader(path, os.environ if env is None else env)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError(path, line, None, f"YAML syntax error: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, None, f"YAML error: {exc}") from exc
    if node is None:
        raise ConfigError(path, 1, None, "the file is empty; it needs at least a roles: section")
    app_sections = {name: fn for app in apps.installed() for name, fn in app.sections.items()}
    top = Section(reader, reader.tree(node, ""), _TOP + tuple(app_sections), extensions=True)

    database = top.get("database", lambda i: _database(reader, i), DatabaseConfig())
    supervisor = _supervisor(reader, top.map.get("supervisor"), path)
    roles_item = top.map.get("roles")
    if roles_item is None or roles_item.value is None:
        raise ConfigError(path, 1, "roles", "is required: map each role name to its processes, queues and actors")
    roles = _roles(reader, roles_item, supervisor)
    schedules = _schedules(reader, top.map.get("schedules"), roles)
    retention = top.get("retention", lambda i: _retention(reader, i), model.Retention())
    http = top.get("http", lambda i: _http(reader, i), None)
    if http is not None and "http" in roles_item.value:
        raise reader.error(roles_item.value["http"], "the role name 'http' is taken by the HTTP child "
                           "(the http: section); rename the role")
    explicit = top.get("apps", _app_names, ())
    app_settings = {name: top.get(name, functools.partial(fn, reader), None) for name, fn in app_sections.items()}
    return Config(path=path, database=database, supervisor=supervisor, roles=roles, schedules=schedules,
                  retention=retention, http=http, apps=explicit,
                  app_settings={k: v for k, v in app_settings.items() if v is not None})


def _app_names(item: Item) -> tuple[str, ...]:
    chosen = names(NAME, "app name")(item)
    known = {a.name for a in apps.installed()}
    for name in chosen:
        if name not in known:
            raise ValueError(f"no app named {name!r} is installed (installed: {', '.join(sorted(known)) or 'none'})")
    return chosen


def _database(reader: Reader, item: Item) -> DatabaseConfig:
    section = Section(reader, item, ("url", "listen_url", "pooled"))
    return DatabaseConfig(url=section.get("url", string), listen_url=section.get("listen_url", string),
                          pooled=section.get("pooled", boolean))


def _path(base: Path) -> Callable[[Item], Path]:
    def check(item: Item) -> Path:
        p = Path(string(item)).expanduser()
        return p if p.is_absolute() else (base / p)

    return check


def _supervisor(reader: Reader, item: Item | None, path: Path) -> SupervisorConfig:
    base = path.resolve().parent
    if item is None or item.value is None:
        item = Item({}, 1, "supervisor")
    s = Section(reader, item, _SUPERVISOR)
    state_dir = s.get("state_dir", _path(base))
    control = s.get("control_socket", _path(base)) or default_control_socket(state_dir)
    if len(str(control).encode()) > 107:
        line_item = s.map.get("control_socket") or item
        raise reader.error(line_item, f"path is too long for a unix socket ({len(str(control))} > 107 bytes): {control}",
                           key="supervisor.control_socket")

    def level(i: Item) -> str:
        v = string(i).upper()
        if v not in _LOG_LEVELS:
            raise ValueError(f"expected one of {', '.join(_LOG_LEVELS)}, got {i.value!r}")
        return v

    cfg = SupervisorConfig(
        control_socket=control,
        state_dir=state_dir,
        shutdown_timeout=s.get("shutdown_timeout", duration(0), defaults.SHUTDOWN_TIMEOUT),
        watch_config=s.get("watch_config", boolean, False),
        tick=s.get("tick", duration(0, strict=True), defaults.TICK),
        log_level=s.get("log_level", level, "INFO"),
        log_json=s.get("log_json", boolean, False),
        job_log=s.get("job_log", boolean, True),
        kill_grace=s.get("kill_grace", duration(0, strict=True), defaults.KILL_GRACE),
        start_timeout=s.get("start_timeout", duration(0, strict=True), defaults.START_TIMEOUT),
        restart_backoff=s.get("restart_backoff", duration(0), defaults.RESTART_BACKOFF),
        restart_backoff_max=s.get("restart_backoff_max", duration(0), defaults.RESTART_BACKOFF_MAX),
        node_name=s.get("node_name", _node_name, None),
    )
    if cfg.tick > 10:
        raise reader.error(s.map["tick"], "must be at most 10s (the master reconciles and beats systemd every tick)")
    if cfg.restart_backoff_max < cfg.restart_backoff:
        raise reader.error(s.map.get("restart_backoff_max") or item, "must not be shorter than restart_backoff",
                           key="supervisor.restart_backoff_max")
    return cfg


def _node_name(item: Item) -> str:
    value = string(item)
    if not NAME.match(value) or len(value) > 63:
        raise ValueError(f"expected a name of letters, digits, '.', '_' or '-' (at most 63), got {item.value!r}")
    return value


def _http(reader: Reader, item: Item) -> HttpConfig:
    s = Section(reader, item, ("listen", "token", "read_only", "tokens"))

    def listen(i: Item) -> tuple[str, int]:
        host, sep, port = string(i).rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port like 127.0.0.1:9191, got {i.value!r}")
        return host.strip("[]"), int(port)

    host, port = s.get("listen", listen, (defaults.HTTP_HOST, defaults.HTTP_PORT))
    token = s.map.get("token")
    # An empty token (``${SUPERVISOR_HTTP_TOKEN:-}`` with the variable unset) means none.
    text = token.value if token is not None else None
    if text is not None and not isinstance(text, str):
        raise reader.error(token, f"expected a string, got {kind(text)}")
    tokens = s.get("tokens", lambda i: _http_tokens(reader, i, single=bool(text)), ())
    if text and any(t.secret == text for t in tokens):
        twin = next(t for t in tokens if t.secret == text)
        raise reader.error(token, f"has the same secret as http.tokens.{twin.name}: each token needs its own")
    return HttpConfig(host=host, port=port, token=text or None, read_only=s.get("read_only", boolean, False),
                      tokens=tokens)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _http_tokens(reader: Reader, item: Item, *, single: bool) -> tuple[HttpToken, ...]:
    """`http.tokens`: NAME: {role: viewer|operator|admin, secret_env: VARIABLE}, the secret
    read from the environment (never written in the file)."""
    if not isinstance(item.value, dict):
        raise reader.error(item, "must map token names to {role, secret_env}, like "
                                 "alice: {role: admin, secret_env: ALICE_TOKEN}")
    out: list[HttpToken] = []
    for name, entry in item.value.items():
        if not NAME.match(name):
            raise reader.error(entry, "token names may use letters, digits, '_', '-' and '.'")
        if name == SINGLE_TOKEN_NAME and single:
            raise reader.error(entry, f"the name {SINGLE_TOKEN_NAME!r} is the single http.token's; rename this one")
        t = Section(reader, entry, ("role", "secret_env"))
        role = t.get("role", string, required=True)
        if role not in ROLES:
            raise reader.error(t.map["role"], f"unknown role {role!r} (roles: {', '.join(ROLES)})")
        variable = t.get("secret_env", string, required=True)
        if not _ENV_NAME.match(variable):
            raise reader.error(t.map["secret_env"], f"expected the name of an environment variable, got {variable!r}")
        secret = reader.env.get(variable, "")
        if not secret.strip():
            raise reader.error(t.map["secret_env"], f"environment variable {variable} is not set (or empty): "
                                                    f"it holds token {name}'s secret")
        twin = next((o for o in out if o.secret == secret), None)
        if twin is not None:
            raise reader.error(t.map["secret_env"], f"{variable} holds the same secret as token {twin.name}: "
                                                    "each token needs its own")
        out.append(HttpToken(name=name, role=role, secret=secret, line=entry.line))
    return tuple(out)


def _roles(reader: Reader, item: Item, sup: SupervisorConfig) -> tuple[RoleConfig, ...]:
    if not isinstance(item.value, dict):
        raise reader.error(item, f"must map role names to role settings, got {kind(item.value)}")
    if not item.value:
        raise reader.error(item, "must define at least one role")
    roles = []
    for name, role_item in item.value.items():
        if not NAME.match(name):
            raise reader.error(role_item, "role names may use letters, digits, '_', '-' and '.'")
        roles.append(_role(reader, name, role_item, sup))
    # A queue served by two roles takes one default priority: two different ones is a mistake.
    given: dict[str, tuple[str, int]] = {}
    for role, role_item in zip(roles, item.value.values(), strict=True):
        priority = role.priority
        if priority is None:
            continue
        for queue in role.queues:
            other = given.setdefault(queue, (role.name, priority))
            if other[1] != priority:
                raise reader.error(role_item.value.get("priority") or role_item,
                                   f"queue {queue!r} has priority {other[1]} in role {other[0]}; one queue takes"
                                   " one default priority", key=f"{role_item.key}.priority")
    return tuple(roles)


def _priority(item: Item) -> int:
    value = item.value
    if isinstance(value, bool) or not isinstance(value, int) or not -1_000_000 <= value <= 1_000_000:
        raise ValueError(f"expected an integer priority (higher runs first), got {value!r}")
    return value


def _role(reader: Reader, name: str, item: Item, sup: SupervisorConfig) -> RoleConfig:
    s = Section(reader, item, _ROLE)
    defaults = RoleConfig(name=name, queues=(), actors=())
    lease = s.get("lease", duration(1), defaults.lease)
    heartbeat = s.get("heartbeat", duration(0, strict=True), defaults.heartbeat)
    if heartbeat >= lease:
        hb = s.map.get("heartbeat") or s.map.get("lease") or item
        raise reader.error(
            hb, f"heartbeat ({heartbeat:g}s) must be shorter than lease ({lease:g}s), or leases expire between beats",
            key=f"{item.key}.heartbeat",
        )
    shutdown = s.get("shutdown_timeout", duration(0), sup.shutdown_timeout)
    if shutdown > sup.shutdown_timeout:
        raise reader.error(
            s.map["shutdown_timeout"],
            f"{shutdown:g}s is longer than supervisor.shutdown_timeout ({sup.shutdown_timeout:g}s): "
            "the master would kill this role's processes before they finish draining",
        )
    min_backoff = s.get("min_backoff", duration(0), defaults.min_backoff)
    max_backoff = s.get("max_backoff", duration(0), defaults.max_backoff)
    if max_backoff < min_backoff:
        raise reader.error(s.map.get("max_backoff") or item, f"must not be shorter than min_backoff ({min_backoff:g}s)",
                           key=f"{item.key}.max_backoff")
    threads = s.get("threads", integer(1), defaults.threads)
    prefetch = s.get("prefetch", integer(1), None)
    if prefetch is not None and prefetch < threads:
        raise reader.error(s.map.get("prefetch") or item, f"must be at least threads ({threads})",
                           key=f"{item.key}.prefetch")
    limits_item = s.map.get("limits")
    return RoleConfig(
        name=name,
        queues=s.get("queues", names(NAME, "queue name"), required=True),
        actors=s.get("actors", names(MODULE, "module name"), required=True),
        processes=s.get("processes", integer(0), defaults.processes),
        threads=threads,
        prefetch=prefetch,
        lease=lease,
        heartbeat=heartbeat,
        max_retries=s.get("max_retries", integer(0), defaults.max_retries),
        min_backoff=min_backoff,
        max_backoff=max_backoff,
        shutdown_timeout=shutdown,
        time_limit=s.get("time_limit", duration(0, strict=True), None),
        poll_interval=s.get("poll_interval", duration(0, strict=True), defaults.poll_interval),
        priority=s.get("priority", _priority, None),
        limits=_limits(reader, limits_item) if limits_item is not None and limits_item.value is not None else Limits(),
        line=item.line,
    )


def _limits(reader: Reader, item: Item) -> Limits:
    s = Section(reader, item, _LIMITS)

    def rss(i: Item) -> int:
        v = parse_size(i.value)
        if v < 1 << 20:
            raise ValueError(f"{i.value!r} is under 1MB; write a size like 512MB")
        return v

    def percent_or_off(i: Item) -> float | None:
        return None if i.value in ("off", False) else percent(i)

    return Limits(
        memory_percent=s.get("memory_percent", percent_or_off, Limits.memory_percent),
        cpu_percent=s.get("cpu_percent", percent),
        max_rss=s.get("max_rss", rss),
        max_jobs=s.get("max_jobs", integer(1)),
    )


def _retention(reader: Reader, item: Item) -> model.Retention:
    s = Section(reader, item, tuple(defaults.RETENTION))
    return model.Retention(**{name: s.get(name, duration(0, strict=True), default)
                        for name, default in defaults.RETENTION.items()})


def _schedules(reader: Reader, item: Item | None, roles: tuple[RoleConfig, ...]) -> tuple[ScheduleConfig, ...]:
    if item is None or item.value is None:
        return ()
    if not isinstance(item.value, dict):
        raise reader.error(item, f"must map schedule names to schedules, got {kind(item.value)}")
    served = {q for r in roles for q in r.queues}
    out = []
    for name, sched_item in item.value.items():
        s = Section(reader, sched_item, _SCHEDULE)
        cron = s.get("cron", string, required=True)
        try:
            cron_parse(cron)
        except ValueError as exc:
            raise reader.error(s.map["cron"], f"bad cron expression {cron!r}: {exc}") from exc
        queue = s.get("queue", string, required=True)
        if queue not in served:
            raise reader.error(
                s.map["queue"], f"queue {queue!r} is served by no role; add it to a role's queues "
                f"(served: {', '.join(sorted(served)) or 'none'})",
            )
        out.append(ScheduleConfig(
            name=name,
            cron=cron,
            actor=s.get("actor", string, required=True),
            queue=queue,
            args=tuple(s.get("args", lambda i: plain(reader, i, sequence=True), [])),
            kwargs=s.get("kwargs", lambda i: plain(reader, i, mapping=True), {}),
            lock_ttl_seconds=s.get("lock_ttl", duration(0, strict=True), defaults.SCHEDULE_LOCK_TTL),
        ))
    return tuple(out)


def control_socket_of(path: str | Path, env: Mapping[str, str] | None = None) -> Path:
    """Only where the control socket is, read leniently.

    Control commands need nothing else from the file, and should still reach the
    master when the file is invalid elsewhere (`supervisor reload` then gets the
    master's own, precise error) or interpolates secrets the operator's shell
    does not have. Raises ConfigError when even this cannot be found out.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(path, None, None, f"cannot read the config file: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(path, mark.line + 1 if mark else None, None, f"YAML syntax error: {exc}") from exc
    sup = data.get("supervisor") if isinstance(data, dict) else None
    sup = sup if isinstance(sup, dict) else {}
    reader = Reader(path, os.environ if env is None else env)
    base = path.resolve().parent

    def value(key: str) -> Path | None:
        raw = sup.get(key)
        if not isinstance(raw, str) or not raw.strip():
            return None
        p = Path(reader.interpolate(raw, 0, f"supervisor.{key}")).expanduser()
        return p if p.is_absolute() else base / p

    return value("control_socket") or default_control_socket(value("state_dir"))


def default_control_socket(state_dir: Path | None) -> Path:
    """Where the control socket is when the config does not say: in the state directory
    (the config's, else the runtime's default)."""
    from ..db import state_dir as default_state_dir

    return (state_dir or default_state_dir()) / "supervisor.sock"
