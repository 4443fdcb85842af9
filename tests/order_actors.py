"""An actor module that adds a middleware, as a user's module may at import time.

ORDER_ACTORS_PLACE says where: "appended" (plain ``add_middleware``, after the broker's
Fence: the worker must refuse to start) or "before-fence" (where it belongs). Each run
of its hook touches a file, so a test sees the middleware ran."""

import os
from pathlib import Path

import dramatiq
from dramatiq.middleware import Middleware

from supervisor.broker.consuming.fencing import Fence


class Stamp(Middleware):
    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        Path(os.environ["ORDER_ACTORS_STAMP"]).touch()


if os.environ.get("ORDER_ACTORS_PLACE") == "before-fence":
    dramatiq.get_broker().add_middleware(Stamp(), before=Fence)
else:
    dramatiq.get_broker().add_middleware(Stamp())


@dramatiq.actor(queue_name="tests", max_retries=0)
def noop() -> None:
    pass
