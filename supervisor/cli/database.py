"""`supervisor migrate` and `supervisor check`."""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import db, exit_codes
from .. import migrate as migrations
from ..config import ConfigError, find_path, load
from .context import apps_in_use, config_given, config_option, die, json_option, obj, url
from .output import print_json

app_option = click.option("--app", "app_names", multiple=True, metavar="NAME",
                          help="Also migrate this app's tables (default: the apps the config uses).")


@click.command()
@config_option
@app_option
@json_option
@click.pass_context
def migrate(ctx: click.Context, app_names: tuple[str, ...], as_json: bool) -> None:
    """Apply pending migrations: the runtime's tables, and those of the apps the
    config uses (safe to run from many hosts at once)."""
    db_url = url(ctx)
    try:
        applied = migrations.migrate(db_url, apps_in_use(ctx, app_names),
                                     progress=lambda line: click.echo(line, err=True))
    except db.DatabaseError as exc:
        die(str(exc), exit_codes.DATABASE)
    if as_json:
        print_json({"applied": [m.name for m in applied]})
    else:
        click.echo(f"{len(applied)} migration(s) applied" if applied else "database is up to date")


@click.command()
@config_option
@app_option
@json_option
@click.pass_context
def check(ctx: click.Context, app_names: tuple[str, ...], as_json: bool) -> None:
    """Validate the config (without starting anything), then check that the
    database is reachable and the schema is current."""
    report: dict[str, Any] = {}
    path = find_path(obj(ctx).get("config"))
    if config_given(ctx) or path.exists():
        report["config"] = {"file": str(path), "ok": False}
        try:
            cfg = load(path)
        except ConfigError as exc:
            report["config"].update(error=str(exc), detail=exc.as_dict())
            report["ok"] = False
            if as_json:
                print_json(report)
            else:
                click.echo(f"config: {path}\n  {exc}\nNOT OK")
            sys.exit(exit_codes.USAGE)
        report["config"].update(ok=True, roles={r.name: r.processes for r in cfg.roles},
                                control_socket=str(cfg.supervisor.control_socket))
    db_url = url(ctx)
    in_use = apps_in_use(ctx, app_names)
    report.update({"database": db.redact(db_url), "apps": [a.name for a in in_use], "reachable": False,
                   "pending": [], "changed": []})
    try:
        with db.connect(db_url) as conn:
            report["reachable"] = True
            report["server_version"] = conn.info.server_version
            report["pending"] = [m.name for m in migrations.pending_migrations(conn, in_use)]
            report["changed"] = [m.name for m in migrations.changed_migrations(conn, in_use)]
    except db.DatabaseError as exc:
        report["error"] = str(exc)
    ok = report["reachable"] and not report["pending"] and not report["changed"]
    report["ok"] = ok
    if as_json:
        print_json(report)
    else:
        if "config" in report:
            roles = ", ".join(f"{n} x{p}" for n, p in report["config"]["roles"].items())
            click.echo(f"config: {report['config']['file']}\n  valid: {roles}")
        click.echo(f"database: {report['database']}")
        if not report["reachable"]:
            click.echo(f"  unreachable: {report.get('error')}")
        else:
            click.echo("  reachable")
            for name in report["pending"]:
                click.echo(f"  pending migration: {name}  (run `supervisor migrate`)")
            for name in report["changed"]:
                click.echo(f"  migration changed since it was applied: {name}")
        click.echo("ok" if ok else "NOT OK")
    sys.exit(0 if ok else (exit_codes.DATABASE if not report["reachable"] else exit_codes.PROBLEM))


