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

from . import forecast_model, settings, store
from .queries import forecasts as sql
from .queries import pipeline as pipeline_sql

log = logging.getLogger(__name__)

QUEUE = "forecasting"


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=30_000)
def forecast_product(product_key: str) -> None:
    run_forecast(product_key)


def run_forecast(product_key: str) -> dict:
    cfg = settings.forecasting()
    with store.pool().connection() as conn:
        rows = conn.execute(pipeline_sql.DAILY_SERIES,
                            {"product_key": product_key, "days": cfg.history_days}).fetchall()
        days = [(d, float(v)) for d, v, _ in rows]
        if len(days) < cfg.min_days:
            reason = (f"only {len(days)} day(s) of prices for {product_key} in the last {cfg.history_days} days;"
                      f" need at least {cfg.min_days}")
            _status(conn, product_key, "skipped", reason, len(days), None)
            log.info("forecast skipped: %s", reason)
            return {"product_key": product_key, "skipped": reason}
        first: date = days[0][0]
        series = forecast_model.fill_gaps([((d - first).days, v) for d, v in days])
        fit = forecast_model.fit(series)
        points = forecast_model.forecast(fit, cfg.horizon_days, level=cfg.level)
        last = days[-1][0]
        dates = [last + timedelta(days=p.h) for p in points]
        with conn.transaction():
            conn.execute(sql.UPSERT_PREDICTIONS, {
                "product_key": product_key, "model_version": forecast_model.MODEL_VERSION, "dates": dates,
                "y_hat": [p.y_hat for p in points], "y_lo": [p.y_lo for p in points],
                "y_hi": [p.y_hi for p in points],
            })
            params = {**asdict(fit.params), "sigma": fit.sigma, "level": cfg.level, "observed_days": len(days)}
            _status(conn, product_key, "ok", None, len(series), params)
    log.info("forecast %s: %d days from %s, %d-day horizon", product_key, len(series), first, len(points))
    return {"product_key": product_key, "days": len(series), "horizon": len(points)}


def _status(conn, product_key: str, status: str, reason: str | None, points: int, params: dict | None) -> None:
    conn.execute(sql.SET_STATUS, {"product_key": product_key, "status": status, "reason": reason,
                                  "points": points, "model_version": forecast_model.MODEL_VERSION,
                                  "params": Jsonb(params) if params is not None else None})


@dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=30_000)
def forecast_daily() -> None:
    """Enqueue a forecast for every product seen within the history window."""
    enqueue_forecasts()


def enqueue_forecasts() -> int:
    broker = store.broker()
    with broker.pool.connection() as conn:
        keys = [r[0] for r in conn.execute(pipeline_sql.ACTIVE_PRODUCT_KEYS,
                                           {"days": settings.forecasting().history_days})]
    broker.enqueue_many([forecast_product.message_with_options(args=(k,), dedupe_key=f"forecast:{k}")
                         for k in keys])
    log.info("forecast_daily: %d products", len(keys))
    return len(keys)
