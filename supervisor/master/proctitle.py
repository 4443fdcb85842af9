"""Readable process titles (`supervisor: scraping[2]`) for ps, top and journald."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def set_title(title: str) -> None:
    try:
        import setproctitle
    except ImportError:  # optional at runtime: a title is a nicety, never a reason to fail
        log.debug("setproctitle is not installed; process title stays %r", title)
        return
    setproctitle.setproctitle(title)


def child_title(role: str, slot: int) -> str:
    return f"supervisor: {role}[{slot}]"


MASTER_TITLE = "supervisor: master"
