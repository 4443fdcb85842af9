"""`/metrics`: Prometheus text format.

Two sources, merged per scrape: the job metrics every worker process of this host
writes (Dramatiq's names, prometheus_client multiprocess files in
$PROMETHEUS_MULTIPROC_DIR, summed here), and snapshot gauges read from the
database (one read of v_queue_capacity, the workers registry, the rate limiters)
and from the local master's status (processes and restarts by role). Reading
files and a few short statements on the HTTP child's own pool: a scrape never
waits on a worker or holds up the master.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import actor_stats, limits, servers
from ..defaults import METRICS_DIR_ENV
from . import data
from .state import AppState, state_of

log = logging.getLogger(__name__)

# One job is in exactly one of them (v_queue_capacity): a sum by queue is its live jobs.
LIVE_STATES = ("ready", "scheduled", "running", "retryable")


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"actor_supervisor_{name}", doc, labels=labels)


class Snapshot:
    """A collector that reads the database and the master at each scrape."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("actor_supervisor_database_up", "1 if the database answered this scrape")
        try:
            snap = data.metrics_snapshot(self.state)
        except Exception as exc:
            log.warning("metrics snapshot failed: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._queues(snap["queues"])
        yield from self._processes(snap["workers"], snap["master"])
        yield from self._limiters(snap["limiters"])
        yield from self._limit_keys(snap["limit_keys"])
        yield self._start_waits(snap["start_waits"])
        yield self._workflows(snap["workflows"])
        for g in snap["app_gauges"]:
            family = GaugeMetricFamily(g.name, g.doc, labels=list(g.labels))
            for labels, value in g.samples:
                family.add_metric(list(labels), value)
            yield family

    def _queues(self, queues: list[dict[str, Any]]) -> Iterator[Metric]:
        jobs = _gauge("jobs", "Live jobs per queue and state, each job in one state: ready (pending, due), "
                      "scheduled (pending or retryable, not due yet), retryable (due again after a failure), "
                      "running", ["queue", "state"])
        finished = _gauge("jobs_finished_last_hour", "Jobs finished in the last hour", ["queue", "outcome"])
        needed = _gauge("queue_workers_needed", "Worker processes needed to drain the backlog within N hours",
                        ["queue", "hours"])
        active = _gauge("queue_active_workers", "Live worker processes serving the queue", ["queue"])
        drain = _gauge("queue_drain_seconds", "Estimated seconds to drain the backlog at the current rate",
                       ["queue"])
        paused = _gauge("queue_paused", "1 if the queue is paused", ["queue"])
        for q in queues:
            name = q["queue"]
            for st in LIVE_STATES:
                jobs.add_metric([name, st], q[st])
            finished.add_metric([name, "succeeded"], q["succeeded_1h"])
            finished.add_metric([name, "failed"], q["failed_1h"])
            for hours in (1, 4, 8):
                value = q[f"workers_needed_{hours}h"]
                if value is not None:
                    needed.add_metric([name, str(hours)], value)
            active.add_metric([name], q["active_workers"])
            if q["drain_seconds"] is not None:
                drain.add_metric([name], q["drain_seconds"])
            paused.add_metric([name], 1 if q["paused"] else 0)
        yield from (jobs, finished, needed, active, drain, paused)

    def _processes(self, workers: list[dict[str, Any]], master: dict[str, Any] | None) -> Iterator[Metric]:
        labels = ["host", "pid", "role"]
        rss = _gauge("process_rss_bytes", "Resident memory per process (workers registry)", labels)
        cpu = _gauge("process_cpu_percent", "CPU per process (workers registry)", labels)
        in_flight = _gauge("process_jobs_in_flight", "Jobs a process holds claimed", labels)
        capacity = _gauge("process_capacity", "Jobs a process may hold claimed at once", labels)
        for w in workers:
            key = [w["host"], str(w["pid"]), w["role"]]
            rss.add_metric(key, w["rss_bytes"] or 0)
            cpu.add_metric(key, w["cpu_percent"] or 0.0)
            in_flight.add_metric(key, w["jobs_in_flight"])
            if w["capacity"] is not None:
                capacity.add_metric(key, w["capacity"])
        yield from (rss, cpu, in_flight, capacity)
        running = _gauge("role_processes", "Ready processes per role (the local master's, else the registry)",
                         ["role"])
        if master is not None:
            wanted = _gauge("role_processes_wanted", "Processes the master keeps per role", ["role"])
            restarts = CounterMetricFamily("actor_supervisor_role_restarts",
                                           "Unexpected exits replaced per role since the master started",
                                           labels=["role"])
            for r in master["roles"]:
                running.add_metric([r["name"]], r["running"])
                wanted.add_metric([r["name"]], r["wanted"])
                restarts.add_metric([r["name"]], r["restarts"])
            yield from (running, wanted, restarts)
            return
        per_role: dict[str, int] = {}
        for w in workers:
            per_role[w["role"]] = per_role.get(w["role"], 0) + 1
        for name, n in sorted(per_role.items()):
            running.add_metric([name], n)
        yield running

    def _limiters(self, limiters: list[dict[str, Any]]) -> Iterator[Metric]:
        tokens = _gauge("rate_limiter_tokens", "Tokens in the bucket now", ["key"])
        granted = CounterMetricFamily("actor_supervisor_rate_limiter_granted", "Takes granted", labels=["key"])
        denied = CounterMetricFamily("actor_supervisor_rate_limiter_denied", "Takes refused", labels=["key"])
        for lim in limiters:
            tokens.add_metric([lim["key"]], lim["tokens_now"])
            granted.add_metric([lim["key"]], lim["granted_total"])
            denied.add_metric([lim["key"]], lim["denied_total"])
        yield from (tokens, granted, denied)

    def _limit_keys(self, keys: list[dict[str, Any]]) -> Iterator[Metric]:
        """Each limit key as the claim sees it (supervisor.limits.seen: the first
        limits.MAX_KEYS keys by name); a gauge of a limit the key has not is left out."""
        per_key = {
            "tokens": ("limit_tokens", "Tokens in the key's bucket now (rate-limited keys)"),
            "burst": ("limit_burst", "The key's burst (most tokens its bucket holds)"),
            "rate": ("limit_rate_per_second", "The key's rate limit, tokens per second"),
            "quota": ("limit_daily_quota", "The key's daily quota (starts per UTC day)"),
            "quota_used": ("limit_daily_quota_used", "Starts counted against the key's quota today"),
            "concurrency": ("limit_concurrency", "The key's concurrency limit (jobs running at once)"),
            "running": ("limit_running", "Jobs of the key running now"),
            "waiting": ("limit_waiting", f"Jobs waiting on the key (counted up to {limits.WAITING_UPTO} a queue)"),
            "wait_s": ("limit_wait_seconds", "How long the key's oldest due waiting job has waited"),
            "opens_in_s": ("limit_opens_in_seconds", "Seconds until the key's gate lets a job start (gated by time)"),
        }
        families = {field: _gauge(name, doc, ["key"]) for field, (name, doc) in per_key.items()}
        blocked = _gauge("limit_blocked_seconds", "Seconds the key stays blocked (RateLimited; 0: not blocked)",
                         ["key"])
        override = _gauge("limit_override", "1 if an operator's override replaces the key's limits", ["key"])
        for k in keys:
            for field, family in families.items():
                if k[field] is not None:
                    family.add_metric([k["key"]], k[field])
            until = k["blocked_until"]
            blocked.add_metric([k["key"]], max(0.0, (until - datetime.now(UTC)).total_seconds()) if until else 0.0)
            override.add_metric([k["key"]], 1 if k["override"] is not None else 0)
        yield from (*families.values(), blocked, override)

    def _workflows(self, by_state: dict[str, int]) -> Metric:
        family = _gauge("workflows", "Workflows per state (running, succeeded, failed, cancelled)", ["state"])
        for state, n in by_state.items():
            family.add_metric([state], n)
        return family

    def _start_waits(self, waits: dict[str, dict[str, float]]) -> Metric:
        """The one figure of the Actors page that Dramatiq's metrics lack (they count
        finished, failed and retried jobs, in progress, and the run time as a histogram)."""
        family = _gauge("actor_start_wait_seconds",
                        f"Start wait (from due to running) of the jobs finished in the last "
                        f"{actor_stats.METRICS_WINDOW_S // 60} minutes, per actor, p50 / p95 / p99",
                        ["actor", "quantile"])
        for actor, pct in sorted(waits.items()):
            for p in actor_stats.PERCENTILES:
                family.add_metric([actor, str(int(p[1:]) / 100)], pct[p])
        return family


def registry_for(state: AppState) -> CollectorRegistry:
    registry = CollectorRegistry()
    path = os.environ.get(METRICS_DIR_ENV)
    if path and os.path.isdir(path):
        servers.declare()  # the reconnect counter's causes, at 0 until one counts (this process's file)
        MultiProcessCollector(registry, path)
    registry.register(Snapshot(state))
    return registry


def scrape(request: Request) -> Response:
    return Response(generate_latest(registry_for(state_of(request))), media_type=CONTENT_TYPE_LATEST)


routes = [Route("/metrics", scrape, methods=["GET"], include_in_schema=False)]
