"""The job log's weighted jobs (migration 056): their turns, and the prune of their floors.

A job whose limit key carries a fairness weight (or a weight and a concurrency limit; no
rate or daily quota) is appended to ``job_log`` with its key and limits, as a
concurrency-keyed one is (slots.LOG_INSERT_KEYED writes both). The claim
(``job_log_claim``) parks each such row it meets in its window in ``job_blocked`` (``turn``:
it waits for its key's turn, not for a slot: ``job_fair_park``), then serves the level's
keys round robin, each key up to its weight a turn, from where the last claim of the queue
stopped (``job_fair_take``; the turn is kept on the queue's cursor, ``job_cursor``, so it is
shared by every process). A key's floor (``job_fair_floor``, appended each turn) is the last
position it took: its next turn reads its parked rows after it, whatever a pinned horizon
keeps below.
"""

# A queue's jobs parked for their key's turn (tests, the bench).
LOG_TURNS = """
SELECT count(*) FROM job_blocked b
 WHERE b.queue = %(queue)s AND b.turn
   AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = b.seq AND d.day = b.day)
"""

# The upkeep's prune (with the cursors'): each key's floors but its newest, and the keys with
# nothing parked for a turn whose newest floor is older than idle_s (so a queue's lap of its
# keys reads the keys in use, not every key it ever served). Returns how many rows went.
LOG_PRUNE_FLOORS = "SELECT job_fair_prune(%(idle_s)s)"
# How long a key keeps its floor with nothing parked: a key that comes back within it is
# served from its floor (the dead index entries of its rows taken before are passed over).
FLOOR_IDLE_SECONDS = 300.0
