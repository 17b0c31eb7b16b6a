"""The worker registry: one :class:`~django_taskclaim.models.WorkerProcess` row per
worker, refreshed by the heartbeat thread (:mod:`.heartbeat`, its only caller while the
worker runs), for operators (admin, stats). Not a thread itself.

Each refresh also lists the bodies running then (model, primary key, seconds running),
and finds a graceful stop an operator asked for (:func:`request_stop`, the admin's
"Stop" action): the refresh's UPDATE skips a row with a stop request, so the usual
refresh is still one statement, and only a worker asked to stop reads its row.

Display only: silence in the registry is never proof of death, and no row is taken from
a silent worker before its lease ends (NO EARLY RE-RUN).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, router
from django.db.models import Model

from django_taskclaim.db import DbNow
from django_taskclaim.rules import live_worker_q, silent_worker_q
from django_taskclaim.worker.dbconn import close, connection_trouble
from django_taskclaim.worker.ledger import Ledger
from django_taskclaim.worker.service import one_line

logger = logging.getLogger("django_taskclaim.worker")

#: The registry row is refreshed at least this often (seconds), whatever the lease.
REGISTRY_INTERVAL = 10.0


def worker_model() -> type[Model]:
    from django_taskclaim.models import WorkerProcess  # deferred: models need the app registry

    return WorkerProcess


def silent_workers(*, using: str | None = None, exclude: Iterable[str] = ()) -> list[str]:
    """Ids of registered, not stopped workers not heard from for
    :func:`~django_taskclaim.rules.silent_after` seconds (database clock). For operators
    (stats, admin): a silent worker may be paused, partitioned or dead; only
    :func:`~django_taskclaim.recovery.reap.release_worker`, called by someone who knows
    it is dead, frees its rows before their leases end."""
    model = worker_model()
    db = using or router.db_for_write(model)
    return list(
        model._default_manager.using(db)
        .filter(silent_worker_q())
        .exclude(worker_id__in=list(exclude))
        .values_list("worker_id", flat=True)
    )


def mark_stopped(worker_id: str, pid: int) -> int:
    """Mark the registry row of ``worker_id`` stopped, if it is still the one process
    ``pid`` of this host registered, for a caller that *knows* that process is dead (its
    supervisor saw it exit): a replacement with the same id then registers as such, not
    as a second live process using the id. Return the rows marked (0 or 1)."""
    model = worker_model()
    db = router.db_for_write(model)
    try:
        return int(
            model._default_manager.using(db)
            .filter(
                worker_id=worker_id,
                pid=pid,
                hostname=socket.gethostname()[:255],
                stopped_at__isnull=True,
            )
            .update(stopped_at=DbNow(), in_flight=0)
        )
    except DatabaseError as exc:
        close(db)
        logger.warning(
            "could not mark exited worker stopped worker=%s error=%s", worker_id, one_line(exc)
        )
        return 0


def request_stop(worker_ids: Iterable[str], by: str, *, using: str | None = None) -> int:
    """Ask the live workers ``worker_ids`` to stop gracefully: each claims nothing more,
    finishes the bodies it runs (within its ``--grace``), gives back what it had not
    started, and exits 0 (a supervised one is not replaced). A worker sees the request at
    its next registry refresh (every ``min(heartbeat, 10 s)``), on whichever host it runs.
    ``by`` names who asked (stored and logged). Workers already stopped or already asked
    are left alone. Return how many were asked."""
    model = worker_model()
    db = using or router.db_for_write(model)
    return int(
        model._default_manager.using(db)
        .filter(worker_id__in=list(worker_ids), stopped_at__isnull=True)
        .filter(stop_requested_at__isnull=True)
        .update(stop_requested_at=DbNow(), stop_requested_by=by[:150])
    )


def _running_rows(running: list[tuple[Any, float]], shown: int) -> list[dict[str, Any]]:
    """The registry's list of running bodies: the longest running first."""
    ordered = sorted(running, key=lambda pair: -pair[1])[:shown]
    return [
        {"model": type(task)._meta.label, "pk": str(task.pk), "age": round(age, 1)}
        for task, age in ordered
    ]


def _was_this_process_or_dead(hostname: str, pid: int | None) -> bool:
    """Whether a registry row of this host names this process, or a process that no
    longer runs here."""
    if hostname != socket.gethostname()[:255] or pid is None:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's): not proven gone
        return False
    return False


class Registry:
    """This process's row in the registry. A missing table (migrations not run) turns
    the registry off with one warning; the worker runs on without it."""

    def __init__(self, worker_id: str, labels: list[str], concurrency: int, ledger: Ledger) -> None:
        self.worker_id = worker_id
        self.labels = sorted(labels)
        self.concurrency = concurrency
        self.ledger = ledger
        self.db = router.db_for_write(worker_model())
        self.ok = True
        #: The bodies running now, as (row, seconds running); set by the worker.
        self.running: Callable[[], list[tuple[Any, float]]] = list
        #: Called once with who asked, when an operator's stop request is found.
        self.on_stop_request: Callable[[str], None] = lambda by: None
        self._stop_seen = False

    def _rows(self) -> Any:
        return worker_model()._default_manager.using(self.db).filter(worker_id=self.worker_id)

    def register(self) -> None:
        """Create or refresh the row. A worker id that another live process may be using
        is warned about: a row heard from recently, not stopped, and not left by this
        process or by a process of this host that no longer runs (a restart under the
        same id)."""
        _in_flight, processed = self.ledger.counts()
        fields = {
            "hostname": socket.gethostname()[:255],
            "pid": os.getpid(),
            "model_labels": self.labels,
            "concurrency": self.concurrency,
            "in_flight": 0,
            "processed": processed,
            "stopped_at": None,
            "running": [],
            # A request was for the process that ran under this id before: not this one.
            "stop_requested_at": None,
            "stop_requested_by": "",
        }
        try:
            qs = self._rows()
            prior = qs.filter(live_worker_q()).values_list("hostname", "pid").first()
            if prior is not None and not _was_this_process_or_dead(*prior):
                logger.warning(
                    "worker id %s is registered as alive: another process may use the same "
                    "--worker-id",
                    self.worker_id,
                )
            if not qs.update(started_at=DbNow(), last_seen=DbNow(), **fields):
                worker_model()._default_manager.using(self.db).create(
                    worker_id=self.worker_id, **fields
                )
        except DatabaseError as exc:
            close(self.db)
            if connection_trouble(exc):
                return  # registered by the next heartbeat that reaches the database
            self.ok = False
            logger.warning(
                "worker registry unavailable worker=%s error=%s (run migrate); continuing without",
                self.worker_id,
                one_line(exc),
            )

    def touch(self) -> None:
        """Refresh ``last_seen``, the counts and the running bodies (re-registers if the
        row is gone); an operator's stop request found calls :attr:`on_stop_request`."""
        if not self.ok:
            return
        from django_taskclaim.models import RUNNING_SHOWN

        in_flight, processed = self.ledger.counts()
        fields = {
            "last_seen": DbNow(),
            "in_flight": in_flight,
            "processed": processed,
            "stopped_at": None,
            "running": _running_rows(self.running(), RUNNING_SHOWN),
        }
        rows = self._rows()
        if rows.filter(stop_requested_at__isnull=True).update(**fields):
            return
        # Not registered yet (outage at start), the row deleted, or asked to stop.
        asked = rows.filter(stop_requested_at__isnull=False).values_list(
            "stop_requested_by", flat=True
        )
        by = next(iter(asked), None)
        if by is None:
            self.register()
            return
        rows.update(**fields)
        if not self._stop_seen:
            self._stop_seen = True
            self.on_stop_request(by or "?")

    def deregister(self) -> None:
        """Mark the row stopped (best effort)."""
        if not self.ok:
            return
        try:
            self._rows().update(
                last_seen=DbNow(), stopped_at=DbNow(), in_flight=0, processed=self.ledger.processed
            )
        except DatabaseError as exc:
            logger.warning(
                "could not mark worker stopped worker=%s error=%s", self.worker_id, one_line(exc)
            )
