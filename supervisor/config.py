"""The YAML config: parsed into frozen, validated dataclasses.

Every error names the file, the line and the dotted key, because the person
reading it is editing that file (often through `supervisor reload`). The node
tree from ``yaml.compose`` keeps line numbers that plain ``safe_load`` throws away.

Relative paths (``control_socket``, ``state_dir``) are relative to the config
file's directory, so the master and every CLI client agree on them whatever
their working directory.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_PATH = Path("config/supervisor.yaml")
ENV_PATH = "SUPERVISOR_CONFIG"


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


# --- the dataclasses -----------------------------------------------------------


@dataclass(frozen=True)
class DatabaseConfig:
    # None: DATABASE_URL, else the embedded server (supervisor.db.resolve_url decides).
    url: str | None = None


@dataclass(frozen=True)
class SupervisorConfig:
    control_socket: Path
    state_dir: Path | None = None
    shutdown_timeout: float = 30.0
    watch_config: bool = False
    tick: float = 0.5
    log_level: str = "INFO"
    log_json: bool = False
    # A hung or overdue child gets this long after SIGTERM before SIGKILL.
    kill_grace: float = 5.0
    # A child that has not become ready this long after its fork is treated as hung.
    start_timeout: float = 60.0
    # Crash backoff per role: restart_backoff * 2^(streak-1), capped.
    restart_backoff: float = 0.5
    restart_backoff_max: float = 30.0


@dataclass(frozen=True)
class Limits:
    # Host-wide thresholds: over either, a process stops claiming until it recovers.
    memory_percent: float | None = None
    cpu_percent: float | None = None
    # Per-process ceilings: past either, the process is recycled (rolled).
    max_rss: int | None = None
    max_jobs: int | None = None


@dataclass(frozen=True)
class RoleConfig:
    name: str
    queues: tuple[str, ...]
    actors: tuple[str, ...]
    processes: int = 1
    threads: int = 8
    # Claimed-but-unfinished rows a process may hold; None means `threads`.
    prefetch: int | None = None
    lease: float = 30.0
    heartbeat: float = 10.0
    max_retries: int = 20
    min_backoff: float = 15.0
    max_backoff: float = 24 * 3600.0
    shutdown_timeout: float = 30.0
    time_limit: float | None = None
    limits: Limits = field(default_factory=Limits)
    line: int = field(default=0, compare=False)

    def differences(self, other: RoleConfig) -> list[str]:
        """Names of the settings (other than line) that differ from ``other``."""
        names = [f for f in self.__dataclass_fields__ if f not in ("line", "name")]
        return [n for n in names if getattr(self, n) != getattr(other, n)]


@dataclass(frozen=True)
class ScheduleConfig:
    name: str
    cron: str
    actor: str
    queue: str
    args: tuple = field(default=(), hash=False)
    kwargs: dict = field(default_factory=dict, hash=False)
    lock_ttl_seconds: float = 300.0


@dataclass(frozen=True)
class Config:
    path: Path
    database: DatabaseConfig
    supervisor: SupervisorConfig
    roles: tuple[RoleConfig, ...]
    schedules: tuple[ScheduleConfig, ...] = ()
    pipeline: dict = field(default_factory=dict, hash=False)

    @property
    def roles_by_name(self) -> dict[str, RoleConfig]:
        return {r.name: r for r in self.roles}

    def role(self, name: str) -> RoleConfig:
        return self.roles_by_name[name]

    def worker_settings(self, name: str):
        """The WorkerSettings a child of role ``name`` runs with."""
        from .process import WorkerSettings

        r = self.role(name)
        return WorkerSettings(
            queues=r.queues,
            actors=r.actors,
            role=r.name,
            threads=r.threads,
            prefetch=r.prefetch or r.threads,
            lease_seconds=r.lease,
            heartbeat_seconds=r.heartbeat,
            shutdown_timeout=r.shutdown_timeout,
            max_retries=r.max_retries,
            min_backoff_ms=int(r.min_backoff * 1000),
            max_backoff_ms=int(r.max_backoff * 1000),
            time_limit_ms=int(r.time_limit * 1000) if r.time_limit else None,
            schedules=self.schedules,
            pipeline=dict(self.pipeline),
        )


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


# --- the located tree -----------------------------------------------------------------


@dataclass
class _Item:
    """A YAML value with where it came from."""

    value: Any  # scalar, dict[str, _Item] or list[_Item]
    line: int
    key: str


_INTERP = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$\{")
_STR_TAG = "tag:yaml.org,2002:str"


class _Reader:
    def __init__(self, path: Path, env: Mapping[str, str]) -> None:
        self.path = path
        self.env = env
        self._loader = yaml.SafeLoader("")  # only for its resolver, merge handling and constructors

    def error(self, item: _Item | None, message: str, key: str | None = None, line: int | None = None) -> ConfigError:
        return ConfigError(
            self.path,
            line if line is not None else (item.line if item else None),
            key if key is not None else (item.key if item else None),
            message,
        )

    def interpolate(self, text: str, line: int, key: str) -> str:
        def sub(m: re.Match) -> str:
            whole = m.group(0)
            if whole == "$$":
                return "$"
            name = m.group(1)
            if name is None:
                raise ConfigError(self.path, line, key, f"bad interpolation in {text!r}: use ${{VAR}} or ${{VAR:-default}}")
            value = self.env.get(name)
            op = m.group(2)
            if op == ":-" and not value or op == "-" and value is None:
                return m.group(3)
            if value is None:
                raise ConfigError(
                    self.path, line, key,
                    f"environment variable {name} is not set (set it, or write ${{{name}:-default}})",
                )
            return value

        return _INTERP.sub(sub, text)

    def tree(self, node: yaml.Node, key: str) -> _Item:
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
            self._loader.flatten_mapping(node)
            merged = len(node.value) - explicit  # '<<' pairs come first; explicit keys override them
            out: dict[str, _Item] = {}
            explicit_names: set[str] = set()
            for index, (k_node, v_node) in enumerate(node.value):
                k_line = k_node.start_mark.line + 1
                if not isinstance(k_node, yaml.ScalarNode) or k_node.tag != _STR_TAG:
                    raise ConfigError(self.path, k_line, key or None, f"keys must be plain names, not {k_node.value!r}")
                name = k_node.value
                child_key = f"{key}.{name}" if key else name
                if name in out and index >= merged and name in explicit_names:
                    raise ConfigError(self.path, k_line, child_key, f"duplicate key (first on line {out[name].line})")
                item = self.tree(v_node, child_key)
                # A mapping's line is that of its key, which is where people look.
                item.line = k_line if not isinstance(v_node, yaml.ScalarNode) else item.line
                out[name] = item
                if index >= merged:
                    explicit_names.add(name)
            return _Item(out, line, key)
        if isinstance(node, yaml.SequenceNode):
            return _Item([self.tree(n, f"{key}[{i}]") for i, n in enumerate(node.value)], line, key)
        return _Item(self.scalar(node, line, key), line, key)

    def scalar(self, node: yaml.ScalarNode, line: int, key: str) -> Any:
        if "$" in node.value and node.tag == _STR_TAG:
            text = self.interpolate(node.value, line, key)
            # An unquoted ${N:-2} means the number 2, as if written in place.
            tag = self._loader.resolve(yaml.ScalarNode, text, (True, False)) if node.style is None else _STR_TAG
            node = yaml.ScalarNode(tag, text, node.start_mark, node.end_mark, style=node.style)
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise ConfigError(self.path, line, key, f"bad value: {exc.problem}") from exc


# --- value checkers -----------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_duration(value: Any) -> float:
    """Seconds from 30, 2.5, '30s', '5m', '1h', '500ms', '1m30s'. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m, 1h, 500ms or a number of seconds")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        sign = 1.0
        if text.startswith("-"):
            sign, text = -1.0, text[1:].strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return sign * float(text)
        pos, total = 0, 0.0
        for m in _DURATION.finditer(text):
            if m.start() != pos and text[pos:m.start()].strip():
                break
            total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        else:
            if pos and not text[pos:].strip():
                return sign * total
    raise ValueError(f"expected a duration like 30s, 5m, 1h, 500ms or a number of seconds, got {value!r}")


def parse_size(value: Any) -> int:
    """Bytes from 536870912, '512MB', '1.5GiB', '800M' (units are binary: MB = MiB)."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 512MB or 2GB")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            unit = (m.group(2) or "b")[0].lower()
            return int(float(m.group(1)) * _SIZE_FACTOR[unit])
    raise ValueError(f"expected a size like 512MB or 2GB, got {value!r}")


class _Section:
    """Reads the keys of one mapping, each at most once, and rejects the rest."""

    def __init__(self, reader: _Reader, item: _Item, allowed: tuple[str, ...], *, extensions: bool = False) -> None:
        if not isinstance(item.value, dict):
            raise reader.error(item, f"must be a mapping of {', '.join(allowed)}, got {_kind(item.value)}")
        self.r = reader
        self.item = item
        self.map: dict[str, _Item] = item.value
        for name, child in self.map.items():
            # x-* keys hold YAML anchors for reuse (as in docker compose) and are ignored.
            if name not in allowed and not (extensions and name.startswith("x-")):
                close = difflib.get_close_matches(name, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
                raise reader.error(child, f"unknown key {name!r}{hint}")

    def key(self, name: str) -> str:
        return f"{self.item.key}.{name}" if self.item.key else name

    def get(self, name: str, check: Callable[[_Item], Any], default: Any = None, *, required: bool = False) -> Any:
        child = self.map.get(name)
        if child is None or child.value is None:
            if required:
                raise self.r.error(self.item, "is required", key=self.key(name))
            return default
        try:
            return check(child)
        except ConfigError:
            raise
        except _BadItem as exc:
            raise self.r.error(exc.item, str(exc)) from exc
        except ValueError as exc:
            raise self.r.error(child, str(exc)) from exc


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    return f"{type(value).__name__} {value!r}"


def _str(item: _Item) -> str:
    if not isinstance(item.value, str) or not item.value.strip():
        raise ValueError(f"expected a non-empty string, got {_kind(item.value)}")
    return item.value


def _bool(item: _Item) -> bool:
    if not isinstance(item.value, bool):
        raise ValueError(f"expected true or false, got {_kind(item.value)}")
    return item.value


def _int(minimum: int) -> Callable[[_Item], int]:
    def check(item: _Item) -> int:
        v = item.value
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected a whole number, got {_kind(v)}")
        if v < minimum:
            raise ValueError(f"must be at least {minimum}, got {v}")
        return v

    return check


def _duration(minimum: float = 0.0, *, strict: bool = False) -> Callable[[_Item], float]:
    def check(item: _Item) -> float:
        seconds = parse_duration(item.value)
        if seconds < minimum or strict and seconds <= minimum:
            bound = f"more than {minimum:g}s" if strict else f"at least {minimum:g}s"
            raise ValueError(f"must be {bound}, got {item.value!r}")
        return seconds

    return check


def _percent(item: _Item) -> float:
    v = item.value
    if isinstance(v, str) and v.strip().endswith("%"):
        v = v.strip()[:-1]
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"expected a percentage like 85 or 85%, got {item.value!r}") from None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a percentage like 85, got {_kind(v)}")
    if not 0 < v <= 100:
        raise ValueError(f"must be between 0 and 100 (exclusive of 0), got {v}")
    return float(v)


class _BadItem(ValueError):
    """A bad element inside a list: the error points at the element's own line."""

    def __init__(self, item: _Item, message: str) -> None:
        super().__init__(message)
        self.item = item


def _names(pattern: re.Pattern, what: str) -> Callable[[_Item], tuple[str, ...]]:
    def check(item: _Item) -> tuple[str, ...]:
        v = item.value
        items = [item] if isinstance(v, str) else v  # a single name is a one-element list
        if not isinstance(items, list):
            raise ValueError(f"expected a list of {what}s, got {_kind(v)}")
        if not items:
            raise ValueError(f"must list at least one {what}")
        out: list[str] = []
        for child in items:
            if not isinstance(child.value, str) or not pattern.match(child.value):
                raise _BadItem(child, f"{_kind(child.value)} is not a valid {what}")
            if child.value in out:
                raise _BadItem(child, f"{child.value!r} is listed twice")
            out.append(child.value)
        return tuple(out)

    return check


# --- sections -------------------------------------------------------------------------------

_TOP = ("database", "supervisor", "roles", "schedules", "pipeline")
_SUPERVISOR = ("control_socket", "state_dir", "shutdown_timeout", "watch_config", "tick", "log_level",
               "log_json", "kill_grace", "start_timeout", "restart_backoff", "restart_backoff_max")
_ROLE = ("processes", "threads", "prefetch", "queues", "actors", "lease", "heartbeat", "max_retries", "min_backoff",
         "max_backoff", "shutdown_timeout", "time_limit", "limits")
_LIMITS = ("memory_percent", "cpu_percent", "max_rss", "max_jobs")
_SCHEDULE = ("cron", "actor", "queue", "args", "kwargs", "lock_ttl")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse(text: str, path: str | Path = "<config>", env: Mapping[str, str] | None = None) -> Config:
    path = Path(path)
    reader = _Reader(path, os.environ if env is None else env)
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
    top = _Section(reader, reader.tree(node, ""), _TOP, extensions=True)

    database = DatabaseConfig(url=top.get("database", lambda i: _database(reader, i), None))
    supervisor = _supervisor(reader, top.map.get("supervisor"), path)
    roles_item = top.map.get("roles")
    if roles_item is None or roles_item.value is None:
        raise ConfigError(path, 1, "roles", "is required: map each role name to its processes, queues and actors")
    roles = _roles(reader, roles_item, supervisor)
    schedules = _schedules(reader, top.map.get("schedules"), roles)
    pipeline = top.get("pipeline", lambda i: _plain(reader, i, mapping=True), {})
    return Config(path=path, database=database, supervisor=supervisor, roles=roles, schedules=schedules,
                  pipeline=pipeline)


def _database(reader: _Reader, item: _Item) -> str | None:
    section = _Section(reader, item, ("url",))
    return section.get("url", _str)


def _path(base: Path) -> Callable[[_Item], Path]:
    def check(item: _Item) -> Path:
        p = Path(_str(item)).expanduser()
        return p if p.is_absolute() else (base / p)

    return check


def _supervisor(reader: _Reader, item: _Item | None, path: Path) -> SupervisorConfig:
    base = path.resolve().parent
    if item is None or item.value is None:
        item = _Item({}, 1, "supervisor")
    s = _Section(reader, item, _SUPERVISOR)
    state_dir = s.get("state_dir", _path(base))
    control = s.get("control_socket", _path(base))
    if control is None:
        from .db import state_dir as default_state_dir

        control = (state_dir or default_state_dir()) / "supervisor.sock"
    if len(str(control).encode()) > 107:
        line_item = s.map.get("control_socket") or item
        raise reader.error(line_item, f"path is too long for a unix socket ({len(str(control))} > 107 bytes): {control}",
                           key="supervisor.control_socket")

    def level(i: _Item) -> str:
        v = _str(i).upper()
        if v not in _LOG_LEVELS:
            raise ValueError(f"expected one of {', '.join(_LOG_LEVELS)}, got {i.value!r}")
        return v

    cfg = SupervisorConfig(
        control_socket=control,
        state_dir=state_dir,
        shutdown_timeout=s.get("shutdown_timeout", _duration(0), 30.0),
        watch_config=s.get("watch_config", _bool, False),
        tick=s.get("tick", _duration(0, strict=True), 0.5),
        log_level=s.get("log_level", level, "INFO"),
        log_json=s.get("log_json", _bool, False),
        kill_grace=s.get("kill_grace", _duration(0, strict=True), 5.0),
        start_timeout=s.get("start_timeout", _duration(0, strict=True), 60.0),
        restart_backoff=s.get("restart_backoff", _duration(0), 0.5),
        restart_backoff_max=s.get("restart_backoff_max", _duration(0), 30.0),
    )
    if cfg.tick > 10:
        raise reader.error(s.map["tick"], "must be at most 10s (the master reconciles and beats systemd every tick)")
    if cfg.restart_backoff_max < cfg.restart_backoff:
        raise reader.error(s.map.get("restart_backoff_max") or item, "must not be shorter than restart_backoff",
                           key="supervisor.restart_backoff_max")
    return cfg


def _roles(reader: _Reader, item: _Item, sup: SupervisorConfig) -> tuple[RoleConfig, ...]:
    if not isinstance(item.value, dict):
        raise reader.error(item, f"must map role names to role settings, got {_kind(item.value)}")
    if not item.value:
        raise reader.error(item, "must define at least one role")
    roles = []
    for name, role_item in item.value.items():
        if not _NAME.match(name):
            raise reader.error(role_item, "role names may use letters, digits, '_', '-' and '.'")
        roles.append(_role(reader, name, role_item, sup))
    return tuple(roles)


def _role(reader: _Reader, name: str, item: _Item, sup: SupervisorConfig) -> RoleConfig:
    s = _Section(reader, item, _ROLE)
    defaults = RoleConfig(name=name, queues=(), actors=())
    lease = s.get("lease", _duration(1), defaults.lease)
    heartbeat = s.get("heartbeat", _duration(0, strict=True), defaults.heartbeat)
    if heartbeat >= lease:
        hb = s.map.get("heartbeat") or s.map.get("lease") or item
        raise reader.error(
            hb, f"heartbeat ({heartbeat:g}s) must be shorter than lease ({lease:g}s), or leases expire between beats",
            key=f"{item.key}.heartbeat",
        )
    shutdown = s.get("shutdown_timeout", _duration(0), sup.shutdown_timeout)
    if shutdown > sup.shutdown_timeout:
        raise reader.error(
            s.map["shutdown_timeout"],
            f"{shutdown:g}s is longer than supervisor.shutdown_timeout ({sup.shutdown_timeout:g}s): "
            "the master would kill this role's processes before they finish draining",
        )
    min_backoff = s.get("min_backoff", _duration(0), defaults.min_backoff)
    max_backoff = s.get("max_backoff", _duration(0), defaults.max_backoff)
    if max_backoff < min_backoff:
        raise reader.error(s.map.get("max_backoff") or item, f"must not be shorter than min_backoff ({min_backoff:g}s)",
                           key=f"{item.key}.max_backoff")
    threads = s.get("threads", _int(1), defaults.threads)
    prefetch = s.get("prefetch", _int(1), None)
    if prefetch is not None and prefetch < threads:
        raise reader.error(s.map.get("prefetch") or item, f"must be at least threads ({threads})",
                           key=f"{item.key}.prefetch")
    limits_item = s.map.get("limits")
    return RoleConfig(
        name=name,
        queues=s.get("queues", _names(_NAME, "queue name"), required=True),
        actors=s.get("actors", _names(_MODULE, "module name"), required=True),
        processes=s.get("processes", _int(0), defaults.processes),
        threads=threads,
        prefetch=prefetch,
        lease=lease,
        heartbeat=heartbeat,
        max_retries=s.get("max_retries", _int(0), defaults.max_retries),
        min_backoff=min_backoff,
        max_backoff=max_backoff,
        shutdown_timeout=shutdown,
        time_limit=s.get("time_limit", _duration(0, strict=True), None),
        limits=_limits(reader, limits_item) if limits_item is not None and limits_item.value is not None else Limits(),
        line=item.line,
    )


def _limits(reader: _Reader, item: _Item) -> Limits:
    s = _Section(reader, item, _LIMITS)

    def rss(i: _Item) -> int:
        v = parse_size(i.value)
        if v < 1 << 20:
            raise ValueError(f"{i.value!r} is under 1MB; write a size like 512MB")
        return v

    return Limits(
        memory_percent=s.get("memory_percent", _percent),
        cpu_percent=s.get("cpu_percent", _percent),
        max_rss=s.get("max_rss", rss),
        max_jobs=s.get("max_jobs", _int(1)),
    )


def _plain(reader: _Reader, item: _Item, *, mapping: bool = False, sequence: bool = False) -> Any:
    """The located tree back to plain Python values."""
    v = item.value
    if mapping and not isinstance(v, dict):
        raise ValueError(f"expected a mapping, got {_kind(v)}")
    if sequence and not isinstance(v, list):
        raise ValueError(f"expected a list, got {_kind(v)}")
    if isinstance(v, dict):
        return {k: _plain(reader, c) for k, c in v.items()}
    if isinstance(v, list):
        return [_plain(reader, c) for c in v]
    return v


def _cron_parser() -> Callable[[str], Any] | None:
    if importlib.util.find_spec("supervisor.cron") is None:
        return None
    return importlib.import_module("supervisor.cron").parse


def _schedules(reader: _Reader, item: _Item | None, roles: tuple[RoleConfig, ...]) -> tuple[ScheduleConfig, ...]:
    if item is None or item.value is None:
        return ()
    if not isinstance(item.value, dict):
        raise reader.error(item, f"must map schedule names to schedules, got {_kind(item.value)}")
    served = {q for r in roles for q in r.queues}
    cron_parse = _cron_parser()
    out = []
    for name, sched_item in item.value.items():
        s = _Section(reader, sched_item, _SCHEDULE)
        cron = s.get("cron", _str, required=True)
        if cron_parse is not None:
            try:
                cron_parse(cron)
            except ValueError as exc:
                raise reader.error(s.map["cron"], f"bad cron expression {cron!r}: {exc}") from exc
        queue = s.get("queue", _str, required=True)
        if queue not in served:
            raise reader.error(
                s.map["queue"], f"queue {queue!r} is served by no role; add it to a role's queues "
                f"(served: {', '.join(sorted(served)) or 'none'})",
            )
        out.append(ScheduleConfig(
            name=name,
            cron=cron,
            actor=s.get("actor", _str, required=True),
            queue=queue,
            args=tuple(s.get("args", lambda i: _plain(reader, i, sequence=True), [])),
            kwargs=s.get("kwargs", lambda i: _plain(reader, i, mapping=True), {}),
            lock_ttl_seconds=s.get("lock_ttl", _duration(0, strict=True), 300.0),
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
    reader = _Reader(path, os.environ if env is None else env)
    base = path.resolve().parent

    def value(key: str) -> Path | None:
        raw = sup.get(key)
        if not isinstance(raw, str) or not raw.strip():
            return None
        p = Path(reader.interpolate(raw, 0, f"supervisor.{key}")).expanduser()
        return p if p.is_absolute() else base / p

    control = value("control_socket")
    if control is None:
        from .db import state_dir as default_state_dir

        control = (value("state_dir") or default_state_dir()) / "supervisor.sock"
    return control
