"""The kinds of child the master forks, and the one interface it runs them by.

A kind says which roles the config asks of it, what else in the config its
children read at start (a change rolls them), and what a child runs after the
fork. Everything else is the same for every kind and lives once in the master:
the fork and the beat pipe (children.spawn, beats.py), the lifecycle
(lifecycle.py), what to start and drain (children.plan), backoff, hang checks,
rolls, reload diffs (reload.py) and `status`.

A new kind: a class with these members (as worker_child.WorkerKind and
http_child.HttpKind), listed in KINDS. Role names are unique across kinds
(the config refuses a clash).
"""

from __future__ import annotations

from typing import Protocol

from ..config import Config, RoleConfig
from .bootstrap import Bootstrap, ChildSpec
from .http_child import HttpKind
from .worker_child import WorkerKind


class ProcessKind(Protocol):
    name: str  # for the docs and the logs
    relayed_wakeups: bool  # its children get the master's NOTIFY relay pipe (master/wakeups.py)

    def roles(self, cfg: Config) -> dict[str, RoleConfig]:
        """The roles of this kind ``cfg`` asks for, by name: the settings the master
        supervises them by (processes, lease, heartbeat, shutdown_timeout, limits)."""
        ...

    def changed(self, old: Config, new: Config) -> list[str]:
        """What changed from ``old`` to ``new``, beyond a role's own settings, that a
        child of this kind reads at start: every role of the kind is rolled for it."""
        ...

    def bootstrap(self, spec: ChildSpec, close_fds: list[int], cfg: Config) -> Bootstrap:
        """What a child of role ``spec.role`` runs after the fork (built before it)."""
        ...


# In the order `status` lists their roles.
KINDS: tuple[ProcessKind, ...] = (WorkerKind(), HttpKind())


def wanted(cfg: Config) -> dict[str, tuple[ProcessKind, RoleConfig]]:
    """Every role ``cfg`` asks for, of any kind, by name."""
    return {name: (kind, role) for kind in KINDS for name, role in kind.roles(cfg).items()}
