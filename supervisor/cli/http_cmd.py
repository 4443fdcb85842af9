"""`supervisor http`: the HTTP server standalone (for a host that runs no workers)."""

from __future__ import annotations

import dataclasses
import os
import sys

import click

from .. import exit_codes
from ..config import HttpConfig, find_path
from ..logs import configure_logging
from .context import config_given, config_option, database, die, load_config, obj


@click.command("http")
@config_option
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="Address to serve on (default: the config's http.listen, else 127.0.0.1:9191).")
@click.option("--token", envvar="SUPERVISOR_HTTP_TOKEN", default=None,
              help="Token every action needs (default: $SUPERVISOR_HTTP_TOKEN, else the config's http.token).")
@click.option("--read-only", is_flag=True, default=None, help="Refuse every action.")
@click.pass_context
def http(ctx: click.Context, listen: str | None, token: str | None, read_only: bool | None) -> None:
    """Serve the JSON API, /metrics, /healthz and /readyz against the database, without
    a master (the master forks the same server when the config has an http: section)."""
    from ..http.server import build

    cfg = load_config(ctx) if config_given(ctx) or find_path(obj(ctx).get("config")).exists() else None
    settings = (cfg.http if cfg is not None else None) or HttpConfig()
    if listen is not None:
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            die(f"--listen: expected HOST:PORT like 127.0.0.1:9191, got {listen!r}", exit_codes.USAGE)
        settings = dataclasses.replace(settings, host=host.strip("[]"), port=int(port))
    if token:
        settings = dataclasses.replace(settings, token=token)
    if read_only:
        settings = dataclasses.replace(settings, read_only=True)
    configure_logging(cfg.supervisor.log_level if cfg else "INFO", cfg.supervisor.log_json if cfg else False)
    chosen = database(ctx)
    try:
        # Standalone, no config tells which apps run here: those whose tables the database holds.
        server = build(url=chosen.url, listen_url=chosen.listen_url, http=settings, config=cfg, apps_from="database")
    except OSError as exc:
        die(f"cannot listen on {settings.listen}: {exc.strerror or exc}", exit_codes.PROBLEM)
    click.echo(f"serving on http://{settings.listen} (pid {os.getpid()})", err=True)
    server.run()
    sys.exit(exit_codes.OK)
