"""The HTTP child: JSON API, Prometheus metrics, health checks (and the dashboard).

``create_app`` in ``app.py`` builds the Starlette app; routes are grouped by module
(``health``, ``metrics``, ``api``), data gathering lives in ``data`` apart from the
rendering, and ``auth.ActionGuard`` guards every action. The master forks the
server through ``supervisor.master.http_child`` (which imports this package only
inside the forked child); ``supervisor http`` runs the same app standalone.
"""
