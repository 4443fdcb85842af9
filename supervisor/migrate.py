"""Migrations: the runtime's tables always, an app's only when the config uses it.

All migration files live under the top-level ``sql/``, one folder per owner
(``sql/runtime``, ``sql/actors``, ...); an installed app may keep its own
folder elsewhere. Version numbers are unique across every owner, so a database
migrated before the split sees no change.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg

from .apps import App
from .db import DatabaseError, connect

RUNTIME = "runtime"
# Any constant works; it only has to be the same for every host running `migrate`.
MIGRATION_LOCK_ID = 0x61637375  # "acsu"
_MIGRATION_NAME = re.compile(r"^(\d{3,})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    owner: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]


def sql_dir(owner: str) -> Path:
    """The bundled folder of migrations of ``owner`` (a checkout, or the installed package)."""
    here = Path(__file__).resolve().parent.parent / "sql" / owner
    if here.is_dir():
        return here
    return Path(str(resources.files("actor_supervisor_sql") / owner))


def load_migrations(apps: Iterable[App] = ()) -> list[Migration]:
    """The runtime's migrations plus those of ``apps``, in version order."""
    folders = [(RUNTIME, sql_dir(RUNTIME))] + [(a.name, a.migrations) for a in apps if a.migrations]
    found: dict[int, Migration] = {}
    for owner, directory in folders:
        for path in sorted(Path(directory).glob("*.sql")):
            match = _MIGRATION_NAME.match(path.name)
            if not match:
                raise DatabaseError(f"{path}: migration files must be named NNN_name.sql")
            version = int(match.group(1))
            if version in found:
                raise DatabaseError(f"{path}: version {version} is used twice ({found[version].name})")
            found[version] = Migration(version, path.stem, path.read_text(), owner)
    return [found[v] for v in sorted(found)]


_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_RECORD = "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)"


def applied_migrations(conn: psycopg.Connection) -> dict[int, str]:
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    return dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())


def migrated_apps(conn: psycopg.Connection, apps: Iterable[App]) -> tuple[App, ...]:
    """The apps among ``apps`` whose every migration this database has applied (an app
    with no migrations needs none): where no config says, these are the apps in use."""
    done = applied_migrations(conn)
    return tuple(a for a in apps
                 if all(m.version in done for m in load_migrations([a]) if m.owner != RUNTIME))


def pending_migrations(conn: psycopg.Connection, apps: Iterable[App] = ()) -> list[Migration]:
    done = applied_migrations(conn)
    return [m for m in load_migrations(apps) if m.version not in done]


def changed_migrations(conn: psycopg.Connection, apps: Iterable[App] = ()) -> list[Migration]:
    """Applied migrations whose file no longer matches what was applied."""
    done = applied_migrations(conn)
    return [m for m in load_migrations(apps) if m.version in done and done[m.version] != m.checksum]


def migrate(url: str, apps: Iterable[App] = (), *, progress: Callable[[str], None] | None = None,
            until: int | None = None) -> list[Migration]:
    """Apply pending migrations (the runtime's and those of ``apps``) in order, each exactly once.

    Each migration is one transaction: a transaction-scoped advisory lock taken
    first serialises concurrent runs (two hosts deploying at once: the second
    waits, then finds that version applied), and the migration commits together
    with its ledger row, so a failure leaves no half-applied version behind. No
    session state: it works through PgBouncer's transaction pooling too.
    """
    # until: only versions up to it (a test fills a database as an older release left it)
    wanted = [m for m in load_migrations(tuple(apps)) if until is None or m.version <= until]
    applied: list[Migration] = []
    with connect(url) as conn:
        while True:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
                conn.execute(_LEDGER)
                done = applied_migrations(conn)  # again under the lock: another run may have applied some
                pending = [m for m in wanted if m.version not in done]
                if not pending:
                    break
                migration = pending[0]
                if progress:
                    progress(f"applying {migration.owner}/{migration.name} ...")
                started = time.monotonic()
                try:
                    with conn.transaction():
                        conn.execute(migration.sql.encode())
                        conn.execute(_RECORD, (migration.version, migration.name, migration.checksum))
                except psycopg.Error as exc:
                    raise DatabaseError(f"migration {migration.name} failed: {exc}".strip()) from exc
            applied.append(migration)
            if progress:
                progress(f"applied {migration.name} in {time.monotonic() - started:.2f}s")
    return applied
