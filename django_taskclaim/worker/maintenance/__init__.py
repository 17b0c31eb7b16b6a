"""The worker's maintenance threads, each a :class:`~django_taskclaim.worker.service.Service`
started and stopped by :class:`~django_taskclaim.worker.process.Worker`:

- :mod:`.heartbeat` — extends the lease of every held row, watches those it could not
  renew, refreshes the registry;
- :mod:`.registry` — the :class:`~django_taskclaim.models.WorkerProcess` row (display only;
  not a thread: the heartbeat refreshes it);
- :mod:`.reaping` — periodic recovery of expired leases (one worker per interval);
- :mod:`.scheduler` — enqueues the due slots of ``@periodic`` schedules;
- :mod:`.listener` — PostgreSQL ``LISTEN`` wake-ups for the claimer.

They sit above :mod:`~django_taskclaim.worker.service` and
:mod:`~django_taskclaim.worker.ledger`, below :mod:`~django_taskclaim.worker.process`.
"""
