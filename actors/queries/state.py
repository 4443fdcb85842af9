"""Every SQL statement on ``system_state`` and ``tracker_notices``."""

SYSTEM_STATE = "SELECT * FROM system_state"

# The settings system_state reads (migration 103), from the config; a row back when changed.
SYNC_SETTINGS = """
INSERT INTO tracker_settings AS t (id, min_samples) VALUES (true, %(min_samples)s)
ON CONFLICT (id) DO UPDATE SET min_samples = EXCLUDED.min_samples, updated_at = now()
 WHERE t.min_samples IS DISTINCT FROM EXCLUDED.min_samples
RETURNING min_samples
"""

WATCH_COUNT = "SELECT count(*) FROM watches"

# A row back: this process logs the notice; the others stay quiet until it is due again.
TAKE_NOTICE = """
INSERT INTO tracker_notices AS n (name, logged_at) VALUES (%(name)s, now())
ON CONFLICT (name) DO UPDATE SET logged_at = now()
 WHERE n.logged_at < now() - %(every_s)s * interval '1 second'
RETURNING name
"""
