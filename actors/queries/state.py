"""Every SQL statement on ``system_state`` and ``tracker_notices``."""

SYSTEM_STATE = "SELECT * FROM system_state"

WATCH_COUNT = "SELECT count(*) FROM watches"

# A row back: this process logs the notice; the others stay quiet until it is due again.
TAKE_NOTICE = """
INSERT INTO tracker_notices AS n (name, logged_at) VALUES (%(name)s, now())
ON CONFLICT (name) DO UPDATE SET logged_at = now()
 WHERE n.logged_at < now() - %(every_s)s * interval '1 second'
RETURNING name
"""
