"""The worker: claims rows of claimable models and runs their tasks, many processes and
machines sharing one table through the database alone.

One process is a set of small pieces around one in-flight ledger (see ``docs/worker.md``
for the diagram and the life of a task through them):

- :mod:`.config` — :class:`WorkerConfig`, every option validated before anything runs;
- :mod:`.ledger` — the rows held (claimed → running → settled → acknowledged): the only
  shared state and the only lock;
- :mod:`.claimer` — the one thread that claims, sized by the executors' demand;
- :mod:`.executors` — threads that run bodies and settle outcomes
  (:func:`~django_taskclaim.settle.outcome.settle`), replaced if they crash;
- :mod:`.bodies` — how a body is called (``async def``, a ``cancel`` parameter);
- :mod:`.aio` — the one event loop of the process, for ``async def`` bodies;
- :mod:`.acks` — completions written together in one fenced UPDATE;
- :mod:`.service` — one base for the background threads (start/stop, waits a stop ends,
  the outage loop and its one backoff rule, ``one_line``) and the one outage tracker;
- :mod:`.maintenance` — the background threads: heartbeat (lease extension of every held
  row; a lost one's body is told: ``task.cancel_requested()``; the registry), registry
  (the :class:`~django_taskclaim.models.WorkerProcess` row, display only), reaping
  (periodic recovery of expired leases), scheduler (``@periodic`` slots), listener
  (``LISTEN`` wake-ups);
- :mod:`.scope` — the rows served (``--queue``), what is left of them, the wake-up mode;
- :mod:`.handback` — rows given back: unstarted ones at once, running ones after grace;
- :mod:`.process` — :class:`Worker`: the wiring, the main loop and grace;
- :mod:`.stopping` — how a process begins to stop: its events, signals, the supervisor
  it must not outlive;
- :mod:`.supervisor` — ``--processes N``: forks and restarts;
- :mod:`.childwatch` — the supervisor's watch of its children's pipes: it kills a child
  before its leases can lapse, or whose body ran past its deadline;
- :mod:`.childexit` — a dead child's rows released at once, its registry row stopped;
- :mod:`.preflight` — waiting for the database and checking its schema before a start;
- :mod:`.dbconn` — connection trouble, backoff, the waits a reconnect ends;
- :mod:`.exits` — exit codes.

``manage.py worker`` only parses its options into :meth:`WorkerConfig.build`.
"""

from __future__ import annotations

from django_taskclaim.deprecation import moved_names
from django_taskclaim.rules import silent_after
from django_taskclaim.settle.outcome import TaskAborted
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.exits import (
    EXIT_BROKEN,
    EXIT_CODES,
    EXIT_CONFIG,
    EXIT_FORCED,
    EXIT_GRACE_EXPIRED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from django_taskclaim.worker.maintenance.registry import silent_workers
from django_taskclaim.worker.process import Worker

__all__ = [
    "EXIT_BROKEN",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_FORCED",
    "EXIT_GRACE_EXPIRED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "TaskAborted",
    "Worker",
    "WorkerConfig",
    "silent_after",
    "silent_workers",
]

#: ``from django_taskclaim.worker import recover``, as earlier docs showed, until 0.2.
__getattr__ = moved_names(__name__)
