"""What an app contributes to the dashboard (``App.pages`` returns these).

``Page`` and ``Table`` are defined with the other app hooks in ``supervisor.apps``, where
each is documented; this name stays for the apps that import them from here.
"""

from __future__ import annotations

from ...apps import Page, Table

__all__ = ["Page", "Table"]
