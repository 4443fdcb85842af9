"""The key reference: every config key with its kind, default and meaning, read from
the declarations (keys.py), for `supervisor config keys` and docs/config-keys.md."""

from __future__ import annotations

from .. import apps
from .keys import Row, rows
from .model import Config

DOCS_PATH = "docs/config-keys.md"


def every_key() -> list[Row]:
    """The runtime's keys, then each installed app's sections."""
    out = list(rows(Config))
    for app in apps.installed():
        for name, cls in (app.section_keys() if app.section_keys else {}).items():
            out.append(Row(name, "mapping", "-", f"The {app.name} app's section."))
            out.extend(rows(cls, f"{name}."))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(found: list[Row]) -> str:
    """The reference as docs/config-keys.md holds it: one table per top-level section."""
    out = [
        "# Config keys",
        "",
        f"<!-- Generated from the key declarations by `supervisor config keys --markdown > {DOCS_PATH}`;",
        "     tests/test_config_keys.py fails when it is out of date. -->",
        "",
        "Every key of the config file, with its default and meaning, as `supervisor config keys` prints",
        "them. Durations take `30s`, `5m`, `1h`, `500ms` or a number of seconds; sizes `512MB`; any value",
        "may be `${VARIABLE}` or `${VARIABLE:-default}`. Keys starting with `x-` at the top level are",
        "ignored (YAML anchors for reuse). A key with a `supervisor worker` flag is that flag's meaning",
        "and default too.",
    ]
    for row in found:
        if "." not in row.key:
            out += ["", f"## `{row.key}`", "", row.meaning, "",
                    "| key | kind | default | `supervisor worker` | meaning |", "|---|---|---|---|---|"]
            if row.kind != "mapping" and not row.kind.startswith("mapping of"):
                out.append(f"| `{row.key}` | {_cell(row.kind)} | {_cell(row.default)} | | {_cell(row.meaning)} |")
            continue
        flag = f"`{row.flag}`" if row.flag else ""
        out.append(f"| `{row.key}` | {_cell(row.kind)} | {_cell(row.default)} | {flag} | {_cell(row.meaning)} |")
    return "\n".join(out) + "\n"
