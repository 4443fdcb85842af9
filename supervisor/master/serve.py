"""`supervisor run`: resolve the database once, migrate, then run the master."""

from __future__ import annotations

import logging
import os

from .. import apps, backoff, db, exit_codes
from ..config import Config
from ..identity import set_node_name
from ..logs import configure_logging
from ..migrate import migrate
from .arbiter import Arbiter

log = logging.getLogger(__name__)

DB_START_PATIENCE = 30.0  # seconds to wait for the database at start before giving up


def serve(cfg: Config) -> int:
    """`supervisor run`: resolve the database once, migrate, then run the master.

    A database that is not there yet (booting with the VM, restarting, out of
    connections) is retried for a while; then the exit code says so and systemd's
    Restart=on-failure tries again later.
    """
    configure_logging(cfg.supervisor.log_level, cfg.supervisor.log_json)
    if cfg.supervisor.state_dir is not None:
        os.environ["SUPERVISOR_STATE_DIR"] = str(cfg.supervisor.state_dir)

    set_node_name(cfg.supervisor.node_name)
    if cfg.database.storage not in (None, "log"):
        log.warning("database.storage: %r is no longer a choice (every job the log takes lives in the log): "
                    "ignored; remove the key", cfg.database.storage)

    def prepare() -> db.Database:
        d = cfg.database
        database = db.resolve(d.url, listen_url=d.listen_url, pooled=d.pooled)
        migrate(database.url, apps.in_use(cfg.actor_modules(), cfg.apps))
        return database

    try:
        database = backoff.retry(prepare, "preparing the database", first=0.5, cap=5.0,
                            give_up_after=DB_START_PATIENCE, logger=log)
    except Exception as exc:
        log.error("cannot prepare the database: %s", db.redact(backoff.describe(exc)))
        return exit_codes.DATABASE
    return Arbiter(cfg, database).run()
