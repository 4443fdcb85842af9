"""Every SQL statement on ``predictions_daily`` and ``forecast_status``."""

# Re-running with the same data writes the same values: only generated_at moves.
UPSERT_PREDICTIONS = """
INSERT INTO predictions_daily AS p (product_key, date, y_hat, y_lo, y_hi, model_version, generated_at)
SELECT %(product_key)s, d, y_hat, y_lo, y_hi, %(model_version)s, now()
  FROM unnest(%(dates)s::date[], %(y_hat)s::float8[], %(y_lo)s::float8[], %(y_hi)s::float8[])
       AS f(d, y_hat, y_lo, y_hi)
ON CONFLICT (product_key, date) DO UPDATE
   SET y_hat = EXCLUDED.y_hat, y_lo = EXCLUDED.y_lo, y_hi = EXCLUDED.y_hi,
       model_version = EXCLUDED.model_version, generated_at = now()
"""

SET_STATUS = """
INSERT INTO forecast_status (product_key, status, reason, points, model_version, params, updated_at)
VALUES (%(product_key)s, %(status)s, %(reason)s, %(points)s, %(model_version)s, %(params)s, now())
ON CONFLICT (product_key) DO UPDATE
   SET status = EXCLUDED.status, reason = EXCLUDED.reason, points = EXCLUDED.points,
       model_version = EXCLUDED.model_version, params = EXCLUDED.params, updated_at = now()
"""

# Products forecast successfully, with the range of their predicted prices.
FORECASTS_OK = """
SELECT s.product_key, s.updated_at, count(p.date), min(p.y_hat), max(p.y_hat)
  FROM forecast_status s JOIN predictions_daily p USING (product_key)
 WHERE s.status = 'ok'
 GROUP BY s.product_key, s.updated_at
 ORDER BY s.product_key
"""
