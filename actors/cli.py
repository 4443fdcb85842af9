"""The price tracker's `supervisor` commands, added through the apps entry point."""

from __future__ import annotations

from typing import Any

import click
from dramatiq.message import Message

from supervisor.cli.context import config_option, json_option, producer
from supervisor.cli.output import print_json


@click.group()
def alerts() -> None:
    """Operator actions on price alerts."""


@alerts.command("resend")
@config_option
@click.argument("alert_id", type=int)
@json_option
@click.pass_context
def alerts_resend(ctx: click.Context, alert_id: int, as_json: bool) -> None:
    """Deliver ALERT_ID again even if an earlier attempt's outcome is unknown
    (at-least-once: the receiver may see it twice; the Idempotency-Key is reused)."""
    message: Message[Any] = Message(queue_name="notification", actor_name="deliver_alert", args=(alert_id,),
                      kwargs={"resend_unknown": True}, options={})
    with producer(ctx) as broker:
        sent = broker.enqueue(message)
    if as_json:
        print_json({"id": sent.message_id, "alert_id": alert_id})
    else:
        click.echo(sent.message_id)


def commands() -> list[click.Command]:
    return [alerts]
