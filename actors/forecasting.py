"""The forecasting role: a daily price forecast per product.

``forecast_product`` builds the product's daily median unit price series from
its price points, fits Holt's damped-trend model (actors/forecast_model.py) and
UPSERTs ``predictions_daily`` for the horizon after the last observed day, so a
re-run on the same data changes nothing but ``generated_at``. Too little history
is recorded in ``forecast_status`` as a skip with its reason, not raised.

``forecast_daily`` is the scheduled job that enqueues one forecast per product
seen recently.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import date, timedelta

import dramatiq
from psycopg.types.json import Jsonb

import supervisor

from . import forecast_model, settings, store
from .queries import forecasts as sql
from .queries import pipeline as pipeline_sql

log = logging.getLogger(__name__)

QUEUE = "forecasting"


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=30_000)
def forecast_product(product_key: str, date_from: str | None = None, date_to: str | None = None) -> dict:
    return run_forecast(product_key, date_from, date_to)


def _day(value: date | str | None) -> date | None:
    return date.fromisoformat(value) if isinstance(value, str) else value


def _range_problem(first: date, last: date, start: date, end: date, max_days: int) -> str | None:
    """Why a requested range cannot be forecast from data observed first..last, if it cannot."""
    if start > end:
        return f"date_from {start} is after date_to {end}"
    if end <= last:
        return (f"range {start}..{end} is not after the data (prices observed {first}..{last});"
                f" forecasts cover days after {last}")
    if (end - last).days > max_days:
        return (f"range {start}..{end} ends {(end - last).days} days after the last observed day {last};"
                f" at most {max_days} (pipeline.forecasting.max_range_days)")
    return None


def run_forecast(product_key: str, date_from: date | str | None = None, date_to: date | str | None = None) -> dict:
    """Forecast ``product_key`` for ``date_from..date_to`` (ISO dates, inclusive),
    by default the ``horizon_days`` after the last observed day."""
    cfg = settings.forecasting()
    with store.pool().connection() as conn:
        rows = conn.execute(pipeline_sql.DAILY_SERIES,
                            {"product_key": product_key, "days": cfg.history_days}).fetchall()
        days = [(d, float(v)) for d, v, _ in rows]
        reason = None
        if len(days) < cfg.min_days:
            reason = (f"only {len(days)} day(s) of prices for {product_key} in the last {cfg.history_days} days;"
                      f" need at least {cfg.min_days}")
        else:
            first, last = days[0][0], days[-1][0]
            end = _day(date_to) or last + timedelta(days=cfg.horizon_days)
            start = max(_day(date_from) or last + timedelta(days=1), last + timedelta(days=1))
            reason = _range_problem(first, last, _day(date_from) or start, end, cfg.max_range_days)
        if reason is not None:
            supervisor.log_fields(rows=0, skipped=reason)
            _status(conn, product_key, "skipped", reason, len(days), None)
            log.info("forecast skipped: %s", reason)
            return {"product_key": product_key, "skipped": reason}
        series = forecast_model.fill_gaps([((d - first).days, v) for d, v in days])
        fit = forecast_model.fit(series)
        points = [p for p in forecast_model.forecast(fit, (end - last).days, level=cfg.level)
                  if last + timedelta(days=p.h) >= start]
        dates = [last + timedelta(days=p.h) for p in points]
        with conn.transaction():
            conn.execute(sql.UPSERT_PREDICTIONS, {
                "product_key": product_key, "model_version": forecast_model.MODEL_VERSION, "dates": dates,
                "y_hat": [p.y_hat for p in points], "y_lo": [p.y_lo for p in points],
                "y_hi": [p.y_hi for p in points],
            })
            params = {**asdict(fit.params), "sigma": fit.sigma, "level": cfg.level, "observed_days": len(days),
                      "from": start.isoformat(), "to": end.isoformat()}
            _status(conn, product_key, "ok", None, len(series), params)
    log.info("forecast %s: %d days from %s, %s..%s", product_key, len(series), first, start, end)
    supervisor.log_fields(rows=len(points), date_from=start.isoformat(), date_to=end.isoformat())
    return {"product_key": product_key, "days": len(series), "horizon": len(points),
            "from": start.isoformat(), "to": end.isoformat(), "rows_affected": len(points)}


def _status(conn, product_key: str, status: str, reason: str | None, points: int, params: dict | None) -> None:
    conn.execute(sql.SET_STATUS, {"product_key": product_key, "status": status, "reason": reason,
                                  "points": points, "model_version": forecast_model.MODEL_VERSION,
                                  "params": Jsonb(params) if params is not None else None})


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=30_000)
def forecast_daily() -> dict:
    """Enqueue a forecast for every product seen within the history window."""
    return {"rows_affected": enqueue_forecasts()}


def enqueue_forecasts() -> int:
    broker = store.broker()
    with broker.actor_pool.connection() as conn:
        keys = [r[0] for r in conn.execute(pipeline_sql.ACTIVE_PRODUCT_KEYS,
                                           {"days": settings.forecasting().history_days})]
    broker.enqueue_many([forecast_product.message_with_options(args=(k,), dedupe_key=f"forecast:{k}")
                         for k in keys])
    log.info("forecast_daily: %d products", len(keys))
    return len(keys)
