"""`supervisor worker`: one worker process in the foreground.

Its flags are the config's own keys: each role or supervisor key declared with a
``flag`` (config/model.py) becomes an option here, with the key's docs line as its
help, checked by the key's own check, and a flag not given takes the key's one default.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .. import apps, db, exit_codes
from ..config import Retention, RoleConfig, SupervisorConfig
from ..config import checks as check
from ..config.keys import Key, declared
from ..logs import configure_logging
from ..migrate import migrate
from .context import config_given, config_option, database, die, load_config

F = TypeVar("F", bound=Callable[..., Any])
# The sections whose keys may have a flag here.
FLAGGED = (RoleConfig, SupervisorConfig)


class KeyValue(click.ParamType[Any]):
    """A flag's word, read as the YAML file would give it and checked by its key's check."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.name = key.kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        key_check = self.key.check
        assert key_check is not None
        raw = key_check.text(value) if isinstance(key_check, check.Check) and isinstance(value, str) else value
        try:
            return key_check(check.Item(raw, 0, self.key.name))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _metavar(k: Key) -> str:
    if "|" in k.kind:
        return "[" + k.kind.replace(" ", "") + "]"
    return "NAME,..." if k.kind.startswith("list of") else k.kind.split()[0].upper()


def key_options(f: F) -> F:
    """An option for every flagged key of FLAGGED, in declaration order. Its default is
    None, so a flag not given leaves the key's declared default."""
    for cls in reversed(FLAGGED):
        for k in reversed(declared(cls)):
            if not k.flag:
                continue
            flag = k.check is check.boolean
            shown = "" if k.required or flag and not k.default else f"  [default: {k.default_text}]"
            f = click.option(*k.flag, k.field, type=None if flag else KeyValue(k), is_flag=flag, default=None,
                             metavar=None if flag else _metavar(k), required=k.required, help=k.doc + shown)(f)
    return f


def given(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The flags of ``cls``'s keys that were given, by field."""
    return {k.field: values[k.field] for k in declared(cls) if k.flag and values.get(k.field) is not None}


def role_of(name: str, flags: dict[str, Any]) -> RoleConfig:
    """The role the flags describe, the config's defaults for the rest."""
    role = RoleConfig(name=name, **given(RoleConfig, flags))
    if role.prefetch is not None and role.prefetch < role.threads:
        # Here a --prefetch under --threads is rounded up (the config refuses it).
        role = dataclasses.replace(role, prefetch=role.threads)
    return role


@click.command()
@config_option
@key_options
@click.option("--role", "role_name", default="worker", show_default=True, help="Role name recorded in the workers table.")
@click.option("--no-migrate", is_flag=True, help="Do not apply pending migrations at start.")
@click.pass_context
def worker(ctx: click.Context, /, role_name: str, no_migrate: bool, **flags: Any) -> None:
    """Run one worker process until SIGTERM, then drain and exit 0."""
    from ..worker.process import run
    from ..worker.settings import WorkerSettings

    role = role_of(role_name, flags)
    for problem in role.problems():
        die(f"--{problem.key.replace('_', '-')}: {problem.message}", exit_codes.USAGE)
    sup = {k.field: k.default for k in declared(SupervisorConfig) if k.flag} | given(SupervisorConfig, flags)
    configure_logging(sup["log_level"], sup["log_json"])
    chosen = database(ctx)
    if not no_migrate:
        try:
            migrate(chosen.url, apps.in_use(role.actors))
        except db.DatabaseError as exc:
            die(str(exc), exit_codes.DATABASE)
    settings = WorkerSettings(
        role=role,
        job_log=sup["job_log"],
        # a config file given (-c or $SUPERVISOR_CONFIG) lends its retention (what the upkeep
        # prunes) and its roles' default priorities (of jobs this process sends)
        retention=load_config(ctx).retention if config_given(ctx) else Retention(),
        queue_priorities=load_config(ctx).queue_priorities() if config_given(ctx) else {},
    )
    sys.exit(run(settings, chosen))
