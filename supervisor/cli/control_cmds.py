"""Commands for the running supervisor: run, reload, scale, status, stop."""

from __future__ import annotations

import sys
from typing import Any

import click
import psycopg

from .. import config as config_mod
from .. import control, exit_codes
from .context import Seconds, config_option, die, json_option, load_config, obj, url
from .output import print_json


def _control(ctx: click.Context, message: dict[str, Any], timeout: float) -> dict[str, Any]:
    path = config_mod.find_path(obj(ctx).get("config"))
    try:
        socket_path = config_mod.load(path).supervisor.control_socket
    except config_mod.ConfigError:
        # Still reach the master if we can tell where it listens: it gives the precise error.
        try:
            socket_path = config_mod.control_socket_of(path)
        except config_mod.ConfigError:
            load_config(ctx)  # prints the full error and exits 2
            raise
    try:
        return control.request(socket_path, message, timeout=timeout)
    except control.ControlError as exc:
        die(str(exc), exit_codes.PROBLEM)


def _report_change(reply: dict[str, Any], as_json: bool, what: str) -> None:
    if as_json:
        print_json(reply)
    if not reply.get("ok"):
        if not as_json:
            click.echo(f"error: {what} failed: {reply.get('error')}", err=True)
            if reply.get("detail"):
                click.echo("the supervisor keeps running its previous config", err=True)
        sys.exit(exit_codes.USAGE if reply.get("detail") else exit_codes.PROBLEM)
    if not as_json:
        click.echo(f"{what} done in {reply.get('seconds', 0):.2f}s:")
        for line in reply.get("changes", []):
            click.echo(f"  {line}")
    for warning in reply.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Log JSON lines (as supervisor.log_json: true).")
@click.pass_context
def run(ctx: click.Context, as_json: bool) -> None:
    """Run the supervisor: fork each role's worker processes and keep them running
    (SIGHUP reloads, SIGTERM drains and exits)."""
    import dataclasses

    from ..master.serve import serve

    cfg = load_config(ctx)
    if obj(ctx).get("database_url_from_cmdline"):
        cfg = dataclasses.replace(cfg, database=config_mod.DatabaseConfig(obj(ctx)["database_url"]))
    if as_json:
        cfg = dataclasses.replace(cfg, supervisor=dataclasses.replace(cfg.supervisor, log_json=True))
    sys.exit(serve(cfg))


@click.command()
@config_option
@click.option("--timeout", default=600.0, show_default=True, type=Seconds(min=0.1),
              help="Seconds to wait for the new state.")
@click.option("--dry-run", is_flag=True, help="Print what a reload would change per role, and change nothing.")
@json_option
@click.pass_context
def reload(ctx: click.Context, timeout: float, dry_run: bool, as_json: bool) -> None:
    """Re-read the config and apply it; wait until the new state is reached.
    An invalid file changes nothing (exit 2, the error names file, line and key)."""
    obj(ctx)["config_error_hint"] = "nothing was changed: the supervisor keeps running its previous config"
    if dry_run:
        _report_diff(_control(ctx, {"cmd": "diff"}, 10.0), as_json)
        return
    _report_change(_control(ctx, {"cmd": "reload"}, timeout), as_json, "reload")


def _report_diff(reply: dict[str, Any], as_json: bool) -> None:
    if not reply.get("ok"):
        _report_change(reply, as_json, "reload --dry-run")  # prints the error, exits
    if as_json:
        print_json(reply)
        return
    click.echo("a reload would (dry run, nothing changed):")
    for name, actions in reply.get("roles", {}).items():
        click.echo(f"  {name}: {'; '.join(actions)}")
    role_lines = {f"{name}: " for name in reply.get("roles", {})}
    for line in reply.get("changes", []):
        if not any(line.startswith(prefix) for prefix in role_lines):
            click.echo(f"  {line}")


@click.command()
@config_option
@click.argument("role")
@click.argument("processes", type=click.IntRange(min=0, max=1000))
@click.option("--timeout", default=600.0, show_default=True, type=Seconds(min=0.1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def scale(ctx: click.Context, role: str, processes: int, timeout: float, as_json: bool) -> None:
    """Run PROCESSES processes of ROLE (until the next reload); wait until they are."""
    _report_change(_control(ctx, {"cmd": "scale", "role": role, "processes": processes}, timeout), as_json, "scale")


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Roles and processes of the running supervisor: pid, state, uptime, RSS, CPU, jobs."""
    reply = _control(ctx, {"cmd": "status"}, 10.0)
    if not reply.get("ok"):
        die(str(reply.get("error")))
    reply["paused_queues"], reply["backing_off"] = _from_database(ctx)
    if as_json:
        print_json(reply)
    else:
        from .status_view import render  # not in `supervisor run`: its children inherit what it imports

        click.echo(render(reply))


def _from_database(ctx: click.Context) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """Paused queues, and the processes of every host that do not claim and why (their
    beats' reasons), read from the database (the master never reads it for status);
    None when the database cannot be reached within two seconds."""
    from .. import admin  # not in `supervisor run`: its children inherit what it imports

    try:
        with psycopg.connect(url(ctx), autocommit=True, connect_timeout=2) as conn:
            backing_off = [{k: w[k] for k in ("host", "pid", "role", "paused_reason")}
                           for w in admin.workers(conn) if w["paused_reason"] and w["stopped_at"] is None]
            return admin.paused_queues(conn), backing_off
    except psycopg.Error:
        return None, None


@click.command()
@config_option
@json_option
@click.option("--timeout", default=600.0, show_default=True, type=Seconds(min=0.1),
              help="Seconds to wait for the master to exit.")
@click.option("--no-wait", is_flag=True, help="Return once the master has started stopping.")
@click.pass_context
def stop(ctx: click.Context, timeout: float, no_wait: bool, as_json: bool) -> None:
    """Drain every role and stop the supervisor."""
    reply = _control(ctx, {"cmd": "stop"}, 10.0)
    if not reply.get("ok"):
        die(str(reply.get("error")))
    if not no_wait and not control.wait_gone(int(reply["pid"]), timeout):
        die(f"master pid {reply['pid']} is still running after {timeout:g}s")
    if as_json:
        print_json({"pid": reply["pid"], "stopped": not no_wait, "stopping": True})
    else:
        click.echo(f"{'stopping' if no_wait else 'stopped'} (master pid {reply['pid']})")


