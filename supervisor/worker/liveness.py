"""A dead process is noticed by its beat, not its lease.

A worker killed with no master to see it (a standalone ``supervisor worker``, or a
whole host) used to keep its jobs until their leases expired (30 s by default). Every
worker's upkeep now looks, every quarter beat (a statement of well under a millisecond
while nobody is dead), for processes that stopped beating and releases their jobs (a
lease loss each, as any release), so they run again within ``STALE_BEATS`` of the dead
process's beat intervals after its last beat, plus a quarter of the looker's.

A beat alone does not tell dead from frozen (SIGSTOP, a stalled VM), and a frozen
process keeps running its jobs when it wakes: releasing them would make the runs
overlap that its lease keeps apart. So a process is released only when the server
holds no session of it (see ``sql.RELEASE_DEAD``): a process that died has none,
since its kernel closed its sockets, while a frozen one keeps them, and is left to
its lease as before. A live process whose sessions all ended (its network path or
proxy reset, the server killing them) is not dead either: it stops its own jobs
once its renewals have failed for ``STALE_BEATS`` beats (``Leases.beat_expiry``),
before anyone may release them. A process whose connections all go through a
pooler has no session of its own to prove it alive: it is left to its leases.
"""

from __future__ import annotations

import logging

from .. import db, defaults
from ..broker import Leases
from ..registry import Registration

log = logging.getLogger(__name__)


def session_name(database: db.Database, *, listens: bool) -> str | None:
    """The application_name the server shows for this process's own sessions, if it
    holds at least one for as long as it lives: every connection when the URL is
    direct; else its own LISTEN connection (``listens``: a standalone worker with a
    direct ``listen_url``). None when all of them go through a pooler, which hands
    one server session to many clients: no session there is this process's own."""
    if not database.pooled:
        return str(db.session_kwargs(database.url)["application_name"])
    if listens and database.listen_url:
        return str(db.session_kwargs(database.listen_url)["application_name"])
    return None


def beat_expiry(heartbeat_seconds: float) -> float:
    """How old a process's beat is when it may be found dead (its leases' twin)."""
    return defaults.STALE_BEATS * heartbeat_seconds


def release_dead(leases: Leases, registration: Registration) -> int:
    """Release the jobs of processes gone without a beat or a session; mark each lost
    once none of its jobs is left running. Returns the jobs released."""
    released = leases.release_dead(defaults.STALE_BEATS)
    owners = sorted({owner for _, _, owner in released})
    if owners:
        log.warning("released %d job(s) of %s: no beat for %g beat intervals and no session left",
                    len(released), ", ".join(owners), defaults.STALE_BEATS)
        registration.mark_lost(owners)
    return len(released)
