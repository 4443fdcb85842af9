"""What the tracker does when one of its worker processes starts (the app's
on_worker_start hook): sync the config's declared sources and watches, and say
how to begin when there is nothing to watch."""

from __future__ import annotations

import logging

from psycopg_pool import ConnectionPool

from supervisor import db, runtime

from . import catalog
from .queries import state as sql
from .settings import SECTION

log = logging.getLogger(__name__)

EMPTY_HINT = ("no watches yet: add one with `supervisor sources add NAME --search-url URL` and "
              "`supervisor watches add --source NAME --query Q`, declare them under pipeline: in the config, "
              "or try `supervisor demo`")


def on_worker_start(pool: ConnectionPool) -> None:
    with pool.connection() as conn:
        report = catalog.sync(conn, runtime.section(SECTION))
        for error in report.errors:
            log.error("config sync: %s", error)
        if report.created or report.updated:
            log.info("config sync: %s", report.line())
        # One line for the whole fleet (every worker starts at once), at most every 10 minutes.
        if db.one(conn.execute(sql.WATCH_COUNT)) == 0 and conn.execute(
                sql.TAKE_NOTICE, {"name": "no-watches", "every_s": 600}).fetchone():
            log.warning(EMPTY_HINT)
