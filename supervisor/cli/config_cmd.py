"""`supervisor config keys`: every config key with its default and meaning."""

from __future__ import annotations

import textwrap

import click

from ..config.docs import every_key, markdown
from .output import print_json


@click.group()
def config() -> None:
    """The config file's keys."""


@config.command("keys")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--markdown", "as_markdown", is_flag=True, help="The reference as docs/config-keys.md holds it.")
def keys(as_json: bool, as_markdown: bool) -> None:
    """Every key of the config file (and of each installed app's sections): its kind,
    default, `supervisor worker` flag and meaning."""
    found = every_key()
    if as_json:
        print_json([r.as_dict() for r in found])
    elif as_markdown:
        click.echo(markdown(found), nl=False)
    else:
        for r in found:
            flag = f"  ({r.flag})" if r.flag else ""
            click.echo(f"{r.key} = {r.default}  [{r.kind}]{flag}")
            click.echo(textwrap.fill(r.meaning, 100, initial_indent="    ", subsequent_indent="    "))
