"""An actor for tests/test_lean_worker.py (queue "lean"): nothing but Dramatiq."""

import os
import sys

import dramatiq


@dramatiq.actor(queue_name="lean", max_retries=0)
def record_modules(path: str) -> None:
    """Write the names of the modules this process has imported, one a line."""
    names = sorted(sys.modules)
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(names))
    os.replace(path + ".tmp", path)  # the test never reads half a list
