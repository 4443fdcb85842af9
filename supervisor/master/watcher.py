"""Config watching: a thread that pokes the master's self-pipe when the file changes."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# Bytes written to the master's self-pipe. Signal numbers arrive there too (set_wakeup_fd).
WAKE = 0
CONFIG_CHANGED = 255


def poke(fd: int, code: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        os.write(fd, bytes([code]))


class ConfigWatcher(threading.Thread):
    """Pokes the master's self-pipe when the config file changes; nothing more."""

    def __init__(self, path: Path, wake_fd: int) -> None:
        super().__init__(name="config-watch", daemon=True)
        self.path = path.resolve()
        self.wake_fd = wake_fd
        self.stop_event = threading.Event()

    def run(self) -> None:
        import watchfiles

        def ours(change: watchfiles.Change, changed: str) -> bool:
            return Path(changed).name == self.path.name

        try:
            for _ in watchfiles.watch(self.path.parent, watch_filter=ours, stop_event=self.stop_event,
                                      debounce=300, step=50, raise_interrupt=False):
                poke(self.wake_fd, CONFIG_CHANGED)
        except Exception as exc:
            log.error("config watcher stopped: %s", exc)
        else:
            # Once the watch is closed and its last poke written: from here on a save
            # reaches the master only by SIGHUP or `reload` (an operator who turned
            # watch_config off sees that it took effect; tests wait for it too).
            log.info("stopped watching %s", self.path)

    def stop(self) -> None:
        self.stop_event.set()
