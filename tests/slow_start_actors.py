"""A role's actor module that keeps its worker from becoming ready while the file named by
SLOW_START_FILE exists: a replacement that takes its time to start, for as long as a test
needs to see its role short (readiness), and no longer."""

import os
import time

from tests import sample_actors  # noqa: F401 - the role's actors

_held = os.environ.get("SLOW_START_FILE")
while _held and os.path.exists(_held):
    time.sleep(0.02)
