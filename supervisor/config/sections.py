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
from typing import Any

import yaml

from .. import apps
from .checks import NAME, names
from .http import SINGLE_TOKEN_NAME, HttpConfig, HttpToken
from .keys import names_of
from .model import (
    Config,
    ConfigError,
    DatabaseConfig,
    Problem,
    Retention,
    RoleConfig,
    ScheduleConfig,
    SupervisorConfig,
)
from .reader import Item, Reader, Section, kind, read_fields, string

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
# Each key is declared once, on its dataclass (model.py, http.py); these functions
# read a section by its declarations and add what needs the file's context.


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
    top = Section(reader, reader.tree(node, ""), names_of(Config) + tuple(app_sections), extensions=True)

    database = top.get("database", _built(reader, DatabaseConfig), DatabaseConfig())
    supervisor = _supervisor(reader, top.map.get("supervisor"), path)
    roles_item = top.map.get("roles")
    if roles_item is None or roles_item.value is None:
        raise ConfigError(path, 1, "roles", "is required: map each role name to its processes, queues and actors")
    roles = _roles(reader, roles_item, supervisor)
    schedules = _schedules(reader, top.map.get("schedules"), roles, supervisor.timezone)
    retention = top.get("retention", _built(reader, Retention), Retention())
    http = top.get("http", lambda i: _http(reader, i), None)
    if http is not None and "http" in roles_item.value:
        raise reader.error(roles_item.value["http"], "the role name 'http' is taken by the HTTP child "
                           "(the http: section); rename the role")
    explicit = top.get("apps", _app_names, ())
    app_settings = {name: top.get(name, functools.partial(fn, reader), None) for name, fn in app_sections.items()}
    return Config(path=path, database=database, supervisor=supervisor, roles=roles, schedules=schedules,
                  retention=retention, http=http, apps=explicit,
                  app_settings={k: v for k, v in app_settings.items() if v is not None})


def _built(reader: Reader, cls: type) -> Callable[[Item], Any]:
    """A section that is its dataclass's keys and nothing more."""
    return lambda item: cls(**read_fields(reader, item, cls))


def _raise_first(reader: Reader, item: Item, problems: list[Problem]) -> None:
    """The first rule between keys the section breaks, at the line of the key to blame
    (else of a key near it, else of the section)."""
    if problems:
        p, given = problems[0], item.value if isinstance(item.value, dict) else {}
        where = next((given[k] for k in (p.key, *p.near) if k in given), item)
        raise reader.error(where, p.message, key=f"{item.key}.{p.key}")


def _app_names(item: Item) -> tuple[str, ...]:
    chosen = names(NAME, "app name")(item)
    known = {a.name for a in apps.installed()}
    for name in chosen:
        if name not in known:
            raise ValueError(f"no app named {name!r} is installed (installed: {', '.join(sorted(known)) or 'none'})")
    return chosen


def _path(base: Path) -> Callable[[Item], Path]:
    def check(item: Item) -> Path:
        p = Path(string(item)).expanduser()
        return p if p.is_absolute() else (base / p)

    return check


def _supervisor(reader: Reader, item: Item | None, path: Path) -> SupervisorConfig:
    if item is None or item.value is None:
        item = Item({}, 1, "supervisor")
    relative = _path(path.resolve().parent)
    values = read_fields(reader, item, SupervisorConfig, {"control_socket": relative, "state_dir": relative})
    if "control_socket" not in values:
        values["control_socket"] = default_control_socket(values.get("state_dir"))
    cfg = SupervisorConfig(**values)
    _raise_first(reader, item, cfg.problems())
    return cfg


def _http(reader: Reader, item: Item) -> HttpConfig:
    cfg = HttpConfig(**read_fields(reader, item, HttpConfig, {"tokens": lambda i: _http_tokens(reader, i)}))
    given = item.value
    if cfg.token:
        single = given["tokens"].value.get(SINGLE_TOKEN_NAME) if cfg.tokens else None
        if single is not None:
            raise reader.error(single, f"the name {SINGLE_TOKEN_NAME!r} is the single http.token's; rename this one")
        twin = next((t for t in cfg.tokens if t.secret == cfg.token), None)
        if twin is not None:
            raise reader.error(given["token"], f"has the same secret as http.tokens.{twin.name}: each token needs its own")
    return cfg


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _http_tokens(reader: Reader, item: Item) -> tuple[HttpToken, ...]:
    """`http.tokens`: NAME: {role: viewer|operator|admin, secret_env: VARIABLE}, the secret
    read from the environment (never written in the file)."""
    if not isinstance(item.value, dict):
        raise reader.error(item, "must map token names to {role, secret_env}, like "
                                 "alice: {role: admin, secret_env: ALICE_TOKEN}")
    out: list[HttpToken] = []
    for name, entry in item.value.items():
        if not NAME.match(name):
            raise reader.error(entry, "token names may use letters, digits, '_', '-' and '.'")

        def secret(i: Item, name: str = name) -> str:
            variable = string(i)
            if not _ENV_NAME.match(variable):
                raise ValueError(f"expected the name of an environment variable, got {variable!r}")
            value = reader.env.get(variable, "")
            if not value.strip():
                raise ValueError(f"environment variable {variable} is not set (or empty): it holds token {name}'s secret")
            return value

        token = HttpToken(name=name, line=entry.line, **read_fields(reader, entry, HttpToken, {"secret_env": secret}))
        twin = next((o for o in out if o.secret == token.secret), None)
        if twin is not None:
            raise reader.error(entry.value["secret_env"], f"{entry.value['secret_env'].value} holds the same secret "
                                                          f"as token {twin.name}: each token needs its own")
        out.append(token)
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
        values = {"shutdown_timeout": sup.shutdown_timeout, **read_fields(reader, role_item, RoleConfig)}
        role = RoleConfig(name=name, line=role_item.line, **values)
        _raise_first(reader, role_item, role.problems(sup.shutdown_timeout))
        roles.append(role)
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


def _schedules(reader: Reader, item: Item | None, roles: tuple[RoleConfig, ...],
               timezone: str) -> tuple[ScheduleConfig, ...]:
    """The schedules, each with its zone (supervisor.timezone where it names none)."""
    if item is None or item.value is None:
        return ()
    if not isinstance(item.value, dict):
        raise reader.error(item, f"must map schedule names to schedules, got {kind(item.value)}")
    served = {q for r in roles for q in r.queues}
    out = []
    for name, sched_item in item.value.items():
        fields = read_fields(reader, sched_item, ScheduleConfig)
        schedule = ScheduleConfig(name=name, **{"timezone": timezone, **fields})
        if schedule.queue not in served:
            raise reader.error(
                sched_item.value["queue"], f"queue {schedule.queue!r} is served by no role; add it to a role's queues "
                f"(served: {', '.join(sorted(served)) or 'none'})",
            )
        out.append(schedule)
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
