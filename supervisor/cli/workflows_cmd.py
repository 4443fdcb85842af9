"""`supervisor workflows`: list, show, cancel and retry durable workflows (migration 049)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from .. import exit_codes, workflow_ops
from .context import config_option, connect, die, json_option
from .output import print_json, table

LIST_COLUMNS = ["id", "name", "state", "policy", "steps", "succeeded", "failed", "cancelled", "open", "created_at",
                "finished_at"]
STEP_COLUMNS = ["position", "id", "actor", "state", "parents", "enqueued_at", "finished_at", "reason"]


@click.group()
def workflows() -> None:
    """Durable workflows: graphs of messages with dependencies (supervisor.workflow)."""


def _before(text: str | None) -> tuple[datetime, str] | None:
    if text is None:
        return None
    at, _, wid = text.rpartition("/")
    try:
        return datetime.fromisoformat(at), wid
    except ValueError:
        die(f"--before takes CREATED_AT/ID (a row's, as --json shows them), not {text!r}", exit_codes.USAGE)


@workflows.command("list")
@config_option
@click.option("--state", type=click.Choice(workflow_ops.STATES), default=None, help="Only workflows in this state.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help="Rows, newest first.")
@click.option("--before", default=None, help="The page after: CREATED_AT/ID of the last row shown.")
@json_option
@click.pass_context
def list_cmd(ctx: click.Context, state: str | None, limit: int, before: str | None, as_json: bool) -> None:
    """Workflows, newest first, with their step counts per state."""
    with connect(ctx) as conn:
        found = workflow_ops.list_workflows(conn, state=state, limit=limit, before=_before(before))
    if as_json:
        print_json(found)
        return
    table(found, LIST_COLUMNS)


def _shown(step: dict[str, Any]) -> dict[str, Any]:
    return {**step, "parents": ",".join(p[:8] for p in step["parents"]) or None}


@workflows.command()
@config_option
@click.argument("workflow_id")
@json_option
@click.pass_context
def show(ctx: click.Context, workflow_id: str, as_json: bool) -> None:
    """A workflow and its steps: state, parents, job id (the step's), timings, reason."""
    with connect(ctx) as conn:
        try:
            found = workflow_ops.show(conn, workflow_id)
        except workflow_ops.WorkflowError as exc:
            die(str(exc), exit_codes.USAGE)
    if found is None:
        die(f"no workflow {workflow_id}", exit_codes.PROBLEM)
    if as_json:
        print_json(found)
        return
    click.echo(f"workflow {found['id']} ({found['name']}): {found['state']}, policy {found['policy']}, "
               f"{found['succeeded']}/{found['steps']} succeeded, {found['failed']} failed, "
               f"{found['cancelled']} cancelled")
    if found["reason"]:
        click.echo(f"reason: {found['reason']}")
    table([_shown(s) for s in found["steps"]], STEP_COLUMNS)


def _change(ctx: click.Context, what: str, workflow_id: str, step: str | None, as_json: bool) -> None:
    with connect(ctx) as conn:
        try:
            done = getattr(workflow_ops, what)(conn, workflow_id, step=step)
        except workflow_ops.WorkflowError as exc:
            die(str(exc), exit_codes.USAGE)
    if as_json:
        print_json({"workflow": workflow_id, "step": step, **done})
        return
    click.echo(", ".join(f"{k} {v}" for k, v in done.items()))


@workflows.command()
@config_option
@click.argument("workflow_id")
@click.option("--step", default=None, help="Only this step and its descendants.")
@json_option
@click.pass_context
def cancel(ctx: click.Context, workflow_id: str, step: str | None, as_json: bool) -> None:
    """Cancel every step not ended (or STEP and its descendants); running ones are interrupted."""
    _change(ctx, "cancel", workflow_id, step, as_json)


@workflows.command()
@config_option
@click.argument("workflow_id")
@click.option("--step", default=None, help="Only this step and its descendants.")
@json_option
@click.pass_context
def retry(ctx: click.Context, workflow_id: str, step: str | None, as_json: bool) -> None:
    """Run again the failed and cancelled steps and their descendants (or STEP and its
    descendants); succeeded steps keep their results."""
    _change(ctx, "retry", workflow_id, step, as_json)
