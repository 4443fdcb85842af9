"""`supervisor nodes`: the hosts in the workers registry; forget a dead one."""

from __future__ import annotations

import click

from .. import exit_codes
from .context import connect, die, json_option
from .output import print_json, rows


@click.group("nodes")
def nodes() -> None:
    """Hosts (node names) in the workers registry."""


@nodes.command("list")
@json_option
@click.pass_context
def nodes_list(ctx: click.Context, as_json: bool) -> None:
    """Each host: live processes, its last beat, whether it still beats."""
    from ..nodes import nodes as read

    with connect(ctx) as conn:
        rows(read(conn), as_json, ["node", "live_processes", "beat_age_s", "beating"])


@nodes.command("forget")
@click.argument("node")
@json_option
@click.pass_context
def nodes_forget(ctx: click.Context, node: str, as_json: bool) -> None:
    """Release every job leased to NODE's processes now and mark them lost (refused
    while NODE still beats): for a host known to be gone, instead of waiting for its
    leases to expire."""
    from ..nodes import NodeError, forget

    with connect(ctx) as conn:
        try:
            done = forget(conn, node)
        except NodeError as exc:
            die(str(exc), exit_codes.PROBLEM)
    if as_json:
        print_json(done)
    else:
        click.echo(f"node {node} forgotten: {done['jobs_released']} job(s) released, "
                   f"{done['processes_lost']} process(es) marked lost")
