"""A supervisor whose SIGTERM comes just as it restarts a child (no database):
``python -m tests.support.supervisor_stop_race DIR``.

The first child exits 5 (broken) at once, so the supervisor restarts it; the stop signal is sent
to the supervisor itself right before that restart forks. Every later child waits for a
stop signal the way a worker does (:meth:`Stop.signals_handled`) and exits 0. Prints
``restarts=N`` and exits with the supervisor's code; a child that is never told to stop
keeps the supervisor waiting forever (the caller's timeout says so).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    from django_taskclaim.worker.stopping import Stop
    from django_taskclaim.worker.supervisor import Supervisor

    marker = Path(sys.argv[1]) / "first-child-ran"

    def target(index: int) -> int:
        if not marker.exists():
            marker.write_text("1")
            return 5  # dies at once (broken): the supervisor restarts it
        stop = Stop("race", os.getppid(), lambda: None)
        with stop.signals_handled():
            stop.stopping.wait(60)
        return 0 if stop.stopping.is_set() else 7

    sup = Supervisor(target, 1)
    spawn = sup._spawn

    def spawn_with_a_stop_arriving(index: int) -> int | None:
        if marker.exists():  # the restart: the signal arrives as it begins
            os.kill(os.getpid(), signal.SIGTERM)
        return spawn(index)

    sup._spawn = spawn_with_a_stop_arriving  # type: ignore[method-assign]
    code = sup.run()
    print(f"restarts={sup.restarts} threads={threading.active_count()}", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
