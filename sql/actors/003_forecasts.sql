-- Daily price forecasts per product, written by UPSERT so re-runs are harmless.

CREATE TABLE predictions_daily (
    product_key   text             NOT NULL,
    date          date             NOT NULL,
    y_hat         double precision NOT NULL,
    y_lo          double precision NOT NULL,
    y_hi          double precision NOT NULL,
    model_version text             NOT NULL,
    generated_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (product_key, date)
);

-- The last forecasting outcome per product, including why it was skipped.
CREATE TABLE forecast_status (
    product_key   text        PRIMARY KEY,
    status        text        NOT NULL CHECK (status IN ('ok', 'skipped')),
    reason        text,
    points        integer     NOT NULL DEFAULT 0,
    model_version text        NOT NULL,
    params        jsonb,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
