"""The dashboard the HTTP child serves at ``/``: server-rendered pages (``views``,
``templates``), their data (``gather``), actions (``actions``), SVG charts (``charts``),
the history and change signal behind them (``recorder``), and what apps add
(``extension``). Every asset ships in the package (``static``); nothing loads from a CDN.
"""

from __future__ import annotations

from . import audit_page, views, workflows_page
from .recorder import Recorder

routes = [*audit_page.routes, *workflows_page.routes, *views.routes]


def start(url: str, *, listen: bool = True) -> Recorder:
    """The recorder for one serving process (call after any fork)."""
    recorder = Recorder(url, listen=listen)
    recorder.start()
    return recorder


__all__ = ["Recorder", "routes", "start"]
