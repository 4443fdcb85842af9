"""Forecasting: Holt's damped trend against known series, and the idempotent actor."""

from __future__ import annotations

import random
from datetime import date, timedelta

import pytest

from actors import forecast_model as fm
from tests.conftest import scalar
from tests.pipeline_helpers import (
    make_source,
    make_watch,
)


def test_the_filter_follows_the_equations_by_hand():
    # y = 10, 12, 13, 15 with alpha 0.5, beta* 0.5 (beta 0.25), phi 0.9; l0 = 10, b0 = (15 - 10) / 3.
    level, trend, sse = fm.run([10, 12, 13, 15], fm.Params(0.5, 0.5, 0.9))
    assert level == pytest.approx(14.68734375)
    assert trend == pytest.approx(1.424765625)
    assert sse == pytest.approx(0.25 + 0.2125 ** 2 + 0.6253125 ** 2)
    f = fm.Fit(fm.Params(0.5, 0.5, 0.9), level, trend, sigma=0.0, sse=sse, n=4)
    assert fm.forecast(f, 2)[1].y_hat == pytest.approx(14.68734375 + (0.9 + 0.81) * 1.424765625)


def test_a_constant_series_forecasts_itself_with_no_spread():
    points = fm.forecast(fm.fit([250.0] * 20), 7)
    assert all(p.y_hat == pytest.approx(250.0) and p.y_lo == p.y_hi == pytest.approx(250.0) for p in points)


def test_a_linear_series_continues_then_flattens():
    y = [50.0 + 2.0 * t for t in range(40)]
    f = fm.fit(y)
    points = fm.forecast(f, 30)
    assert points[0].y_hat == pytest.approx(130.0, abs=0.1)
    steps = [b.y_hat - a.y_hat for a, b in zip(points, points[1:], strict=False)]
    assert all(s > 0 for s in steps) and all(b < a for a, b in zip(steps, steps[1:], strict=False))  # damped
    assert points[-1].y_hat < 50.0 + 2.0 * (39 + 30)


def test_noisy_level_is_recovered_with_a_sensible_interval():
    rng = random.Random(7)
    y = [100.0 + rng.gauss(0, 2) for _ in range(90)]
    points = fm.forecast(fm.fit(y), 14)
    assert points[0].y_hat == pytest.approx(100.0, abs=1.5)
    assert 2 * 1.96 * 1.5 < points[0].y_hi - points[0].y_lo < 2 * 1.96 * 3
    assert all(b.y_hi - b.y_lo >= a.y_hi - a.y_lo for a, b in zip(points, points[1:], strict=False))


def test_interval_width_matches_simulated_forecast_errors():
    """Simulate the model from a known state; the h-step spread must match the
    variance formula the intervals are built from."""
    p = fm.Params(0.3, 0.2, 0.9)
    h, runs, rng = 6, 4000, random.Random(11)
    finals = []
    for _ in range(runs):
        level, trend = 100.0, 1.0
        for _ in range(h):
            e = rng.gauss(0, 1)
            y = level + p.phi * trend + e
            level, trend = level + p.phi * trend + p.alpha * e, p.phi * trend + p.beta * e
        finals.append(y)
    mean = sum(finals) / runs
    var = sum((v - mean) ** 2 for v in finals) / (runs - 1)
    point = fm.forecast(fm.Fit(p, 100.0, 1.0, 1.0, 0.0, 0), h, level=0.95, floor=None)[-1]
    z = 1.959963984540054
    assert point.y_hat == pytest.approx(mean, abs=0.1)
    assert ((point.y_hi - point.y_hat) / z) ** 2 == pytest.approx(var, rel=0.08)


def test_fill_gaps():
    assert fm.fill_gaps([(0, 10.0), (3, 16.0), (4, 12.0)]) == [10.0, 12.0, 14.0, 16.0, 12.0]


# --- the actor -------------------------------------------------------------------------


def seed_series(conn, product_key: str, prices: list[float | None]) -> date:
    """One listing per day (None: no observation that day), ending yesterday."""
    source_id = make_source(conn, f"src-{product_key}")
    watch_id = make_watch(conn, source_id, product_key)
    end = date.today() - timedelta(days=1)
    for k, price in enumerate(prices):
        if price is None:
            continue
        day = end - timedelta(days=len(prices) - 1 - k)
        lid = conn.execute(
            "INSERT INTO listings (source_id, external_id, title, price_cents, product_key, attributes)"
            " VALUES (%s, %s, 't', %s, %s, '{}') RETURNING id", (source_id, f"{product_key}-{k}", price, product_key),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO price_points (watch_id, source_id, listing_id, dedupe_key, price_cents, currency,"
            " price_type, observed_on, match_strength) VALUES (%s, %s, %s, %s, %s, 'USD', 'ask', %s, 1)",
            (watch_id, source_id, lid, f"ext_{k}", price, day),
        )
    return end


def test_forecast_upserts_the_horizon_and_reruns_change_only_generated_at(conn, pipeline_broker, pipeline_config):
    from actors.forecasting import run_forecast

    pipeline_config["forecasting"] = {"horizon_days": 7}
    prices = [20_000.0 - 100 * k for k in range(30)]
    prices[10] = prices[11] = None  # gaps are interpolated
    last = seed_series(conn, "gpu:rtx3080", prices)
    result = run_forecast("gpu:rtx3080")
    assert {k: result[k] for k in ("product_key", "days", "horizon", "rows_affected")} == {
        "product_key": "gpu:rtx3080", "days": 30, "horizon": 7, "rows_affected": 7}
    rows = conn.execute("SELECT date, y_hat, y_lo, y_hi, model_version, generated_at FROM predictions_daily"
                        " WHERE product_key = 'gpu:rtx3080' ORDER BY date").fetchall()
    assert [r[0] for r in rows] == [last + timedelta(days=h) for h in range(1, 8)]
    assert rows[0][1] == pytest.approx(20_000 - 100 * 30, rel=0.01)
    assert all(r[2] <= r[1] <= r[3] and r[4] == fm.MODEL_VERSION for r in rows)
    status = conn.execute("SELECT status, points, params->>'phi' FROM forecast_status").fetchone()
    assert status[0] == "ok" and status[1] == 30 and fm.PHI_MIN <= float(status[2]) <= fm.PHI_MAX

    run_forecast("gpu:rtx3080")
    again = conn.execute("SELECT date, y_hat, y_lo, y_hi, model_version, generated_at FROM predictions_daily"
                         " WHERE product_key = 'gpu:rtx3080' ORDER BY date").fetchall()
    assert [r[:5] for r in again] == [r[:5] for r in rows]
    assert all(b[5] > a[5] for a, b in zip(rows, again, strict=True))


def test_too_little_history_is_a_recorded_skip(conn, pipeline_broker, pipeline_config):
    from actors.forecasting import run_forecast

    seed_series(conn, "cpu:i7-12700k", [30_000.0, None, 29_000.0, 29_500.0])
    result = run_forecast("cpu:i7-12700k")
    assert "only 3 day(s) of prices" in result["skipped"] and "need at least 10" in result["skipped"]
    assert conn.execute("SELECT status, points FROM forecast_status").fetchone() == ("skipped", 3)
    assert scalar(conn, "SELECT count(*) FROM predictions_daily") == 0
    assert run_forecast("nothing:at:all")["skipped"].startswith("only 0 day(s)")


def test_a_requested_range_is_forecast_and_bad_ranges_are_clear_skips(conn, pipeline_broker, pipeline_config):
    from actors.forecasting import run_forecast

    pipeline_config["forecasting"] = {"max_range_days": 30}
    last = seed_series(conn, "ram:ddr4:32", [10_000.0 + 10 * k for k in range(15)])
    start, end = last + timedelta(days=3), last + timedelta(days=5)
    result = run_forecast("ram:ddr4:32", start.isoformat(), end.isoformat())
    assert result["horizon"] == 3 and result["rows_affected"] == 3
    assert [r[0] for r in conn.execute("SELECT date FROM predictions_daily ORDER BY date")] == [
        start, start + timedelta(days=1), end]

    before = run_forecast("ram:ddr4:32", (last - timedelta(days=9)).isoformat(), last.isoformat())
    assert "is not after the data" in before["skipped"] and str(last) in before["skipped"]
    too_long = run_forecast("ram:ddr4:32", None, (last + timedelta(days=31)).isoformat())
    assert "ends 31 days after the last observed day" in too_long["skipped"] and "at most 30" in too_long["skipped"]
    backwards = run_forecast("ram:ddr4:32", end.isoformat(), start.isoformat())
    assert backwards["skipped"] == f"date_from {end} is after date_to {start}"
    assert conn.execute("SELECT status, reason FROM forecast_status").fetchone() == ("skipped", backwards["skipped"])
    assert scalar(conn, "SELECT count(*) FROM predictions_daily") == 3


def test_forecast_daily_enqueues_one_job_per_recent_product(conn, pipeline_broker):
    from actors.forecasting import enqueue_forecasts

    seed_series(conn, "a:1", [1.0, 2.0])
    seed_series(conn, "b:2", [1.0])
    assert enqueue_forecasts() == 2
    assert enqueue_forecasts() == 2
    assert sorted(r[0] for r in conn.execute("SELECT dedupe_key FROM jobs WHERE actor = 'forecast_product'")) == [
        "forecast:a:1", "forecast:b:2"]
