"""The worker: threads that claim, run and settle tasks of claimable models.

:class:`Worker` is a plain class (the management command only parses and validates).
One worker process runs:

- ``concurrency`` executor threads, each on its own database connection, kept open
  across tasks whatever ``CONN_MAX_AGE`` says (a broken connection is closed and
  replaced, with backoff, instead of reconnecting around every task). Each thread claims
  up to ``batch`` rows at a time and runs them one after the other.
- a heartbeat thread that extends, in one statement per model, the leases of every row
  the process holds (running *and* claimed-but-not-started) and refreshes the worker's
  row in the registry (:class:`~django_taskclaim.models.WorkerProcess`). A row whose
  extension fails was taken back: it is marked lost, never started if it had not been,
  and a warning is logged; its holder's later writes are fenced by the token anyway.
- a reaper thread (unless ``reap=False``) that, at most once per ``TASKCLAIM_REAP_INTERVAL``
  across all hosts (a lease lock), recovers rows whose lease expired (database clock).
  A worker that falls silent is never declared dead: its rows wait for their lease
  (NO EARLY RE-RUN). Only proof of death frees them early: the ``--processes``
  supervisor saw the process exit (:func:`~django_taskclaim.reaper.release_worker`).

Executors never die silently: a handler's ``BaseException`` (``SystemExit``,
``KeyboardInterrupt``…) is that task's failure; an executor that crashes for any other
reason is logged and replaced; a worker whose executors keep crashing stops with
:data:`EXIT_BROKEN` so that its supervisor restarts it.
- on PostgreSQL, a listener thread (``LISTEN``; see :mod:`django_taskclaim.notify`);
  idle executors also poll with jitter, so a missed notification only delays a task.

Shutdown: the first SIGTERM/SIGINT stops claiming, releases claimed-but-unstarted rows at
once (attempt not counted) and lets running tasks finish within ``grace`` seconds; the
second signal exits at once (leases recover the rest). See :data:`EXIT_CODES`.
"""

from __future__ import annotations

import copy
import importlib
import logging
import math
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections, router
from django.db.models import F, Model

from .conf import taskclaim_settings
from .db import DbNow, default_worker_id
from .exceptions import ClaimLost, ConfigurationError, Fail, Retry
from .lifecycle import complete_many, run_task
from .options import claimable_models, get_options, resolve_model
from .querysets import ClaimQuerySet
from .reaper import ReapResult, reap
from .strategies import resolve, was_recovered

logger = logging.getLogger("django_taskclaim.worker")

EXIT_OK = 0
EXIT_CONFIG = 1
EXIT_USAGE = 2
EXIT_GRACE_EXPIRED = 3
EXIT_FORCED = 4
EXIT_BROKEN = 5

#: Exit codes of ``manage.py taskclaim_worker`` (and of each supervised process).
EXIT_CODES = {
    EXIT_OK: "stopped cleanly (signal, --burst drained, --max-tasks or --max-runtime reached)",
    EXIT_CONFIG: "configuration or command-line value refused before starting",
    EXIT_USAGE: "unknown option (argument parser error)",
    EXIT_GRACE_EXPIRED: "stopped with tasks still running after --grace (they were requeued)",
    EXIT_FORCED: "second signal: exited at once; leases recover the held rows",
    EXIT_BROKEN: "executors kept crashing (logged): the worker cannot run tasks; restart it",
}

#: Executor crashes tolerated within :data:`CRASH_WINDOW` seconds before the worker
#: gives up with :data:`EXIT_BROKEN`.
MAX_CRASHES = 5
CRASH_WINDOW = 60.0
#: The registry row is refreshed at least this often (seconds), whatever the lease.
REGISTRY_INTERVAL = 10.0
#: Bounds of the worker's numeric options (all finite).
LIMITS: dict[str, tuple[float, float]] = {
    "--concurrency": (1, 256),
    "--processes": (1, 256),
    "--batch": (1, 10_000),
    "--lease": (1.0, 30 * 24 * 3600.0),
    "--poll": (0.01, 3600.0),
    "--ack-window": (0.0, 60.0),
    "--grace": (0.0, 24 * 3600.0),
    "--max-tasks": (1, 10**12),
    "--max-runtime": (0.01, 366 * 24 * 3600.0),
}

REAP_LOCK_KEY = "taskclaim:reap"


def _connection_trouble(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError | InterfaceError)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def _close(using: str) -> None:
    """Drop this thread's connection to ``using`` so the next query reconnects."""
    try:
        connections[using].close()
    except Exception:  # already broken: closing is best effort
        pass


def _positive(value: Any, name: str, kind: type = int, *, allow_zero: bool = False) -> Any:
    """``value`` as ``kind``, finite, above 0 (or >= 0) and within :data:`LIMITS`."""
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        what = "a whole number" if kind is int else "a number"
        raise ConfigurationError(f"{name} must be {what}, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} must be a finite number, got {value!r}")
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{name} must be {bound}, got {value!r}")
    low, high = LIMITS.get(name, (0, math.inf))
    if not low <= number <= high:
        raise ConfigurationError(f"{name} must be from {low:g} to {high:g}, got {value!r}")
    return number


@dataclass
class WorkerConfig:
    """Validated settings of one worker process (see :meth:`WorkerConfig.build`)."""

    models: list[type[Model]]
    using: str = "default"
    concurrency: int = 1
    batch: int = 1
    lease: float | None = None
    poll: float = 1.0
    ack_window: float = 0.05
    grace: float = 30.0
    burst: bool = False
    until_empty: bool = False
    max_tasks: int | None = None
    max_runtime: float | None = None
    worker_id: str | None = None
    reap: bool = True
    queue: str | None = None
    handlers: dict[type[Model], Callable[[Any], Any]] = field(default_factory=dict)
    strategies: dict[type[Model], str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        labels: Sequence[str] = (),
        *,
        using: str | None = None,
        concurrency: Any = 1,
        processes: Any = 1,
        batch: Any = 1,
        lease: Any = None,
        poll: Any = None,
        ack_window: Any = None,
        grace: Any = 30,
        burst: bool = False,
        max_tasks: Any = None,
        max_runtime: Any = None,
        worker_id: str | None = None,
        reap: bool = True,
        queue: str | None = None,
        until_empty: bool = False,
    ) -> WorkerConfig:
        """Validate user input; raise :class:`ConfigurationError` naming the fix.

        Touches no table: a refused configuration leaves the database unchanged.
        """
        using = using or "default"
        if using not in settings.DATABASES:
            raise ConfigurationError(
                f"--database {using!r} is not in settings.DATABASES; "
                f"choose one of {', '.join(settings.DATABASES)}"
            )
        if until_empty and not burst:
            raise ConfigurationError(
                "--until-empty goes with --burst (a worker without --burst never stops "
                "when the queue is empty)"
            )
        concurrency = _positive(concurrency, "--concurrency")
        processes = _positive(processes, "--processes")
        batch = _positive(batch, "--batch")
        lease = _positive(lease, "--lease", float)
        poll = _positive(
            poll if poll is not None else taskclaim_settings.POLL_INTERVAL, "--poll", float
        )
        ack_window = _positive(
            ack_window if ack_window is not None else taskclaim_settings.ACK_WINDOW,
            "--ack-window",
            float,
            allow_zero=True,
        )
        grace = _positive(grace, "--grace", float, allow_zero=True)
        max_tasks = _positive(max_tasks, "--max-tasks")
        max_runtime = _positive(max_runtime, "--max-runtime", float)
        beat = _heartbeat_setting()
        if worker_id is not None and (not worker_id.strip() or len(worker_id) > 200):
            raise ConfigurationError("--worker-id must be 1 to 200 characters")
        conn = connections[using]
        if conn.vendor == "sqlite" and (concurrency > 1 or processes > 1):
            name = str(conn.settings_dict.get("NAME") or "")
            if name in ("", ":memory:") or "mode=memory" in name:
                raise ConfigurationError(
                    "an in-memory SQLite database is private to one connection: use a "
                    "database file, or --concurrency 1 --processes 1"
                )
        explicit = bool(labels)
        chosen: list[type[Model]] = []
        for label in labels:
            model = resolve_model(label)
            if model not in chosen:
                chosen.append(model)
        if not explicit:
            chosen = [m for m in claimable_models() if _handler_or_none(m) is not None]
            if not chosen:
                raise ConfigurationError(
                    "no claimable model with a processing entry point is installed: give a "
                    "process(self) method or ClaimMeta.handler to a model using "
                    "ClaimableModel, or name models as app_label.ModelName"
                )
        if queue is not None:
            with_queue = [m for m in chosen if _has_field(m, "queue_name")]
            if explicit and len(with_queue) != len(chosen):
                missing = [m._meta.label for m in chosen if m not in with_queue]
                raise ConfigurationError(
                    f"--queue needs a queue_name field; {', '.join(missing)} has none: "
                    "drop --queue or those models"
                )
            if not with_queue:
                raise ConfigurationError(
                    "--queue needs models with a queue_name field and none has one; drop --queue"
                )
            chosen = with_queue
        handlers: dict[type[Model], Callable[[Any], Any]] = {}
        strategies: dict[type[Model], str] = {}
        for model in chosen:
            handler = _handler_or_none(model)
            if handler is None:
                raise ConfigurationError(
                    f"{model._meta.label} has no processing entry point: define a "
                    "process(self) method on it or set ClaimMeta.handler"
                )
            handlers[model] = handler
            opts = get_options(model)
            name = opts.strategy
            if name == "hold":
                raise ConfigurationError(
                    f"{model._meta.label} uses strategy 'hold', which keeps a transaction "
                    "open around the task body; the worker runs tasks outside transactions: "
                    "set ClaimMeta.strategy to 'auto'"
                )
            strategies[model] = name
            model_lease = float(lease or opts.lease)  # validates the model's lease now
            if beat is not None and beat >= model_lease / 2:
                raise ConfigurationError(
                    f"TASKCLAIM_HEARTBEAT_INTERVAL ({beat:g}s) must be under half the lease "
                    f"of {model._meta.label} ({model_lease:g}s), or one late heartbeat "
                    "lets a live lease lapse: lower it or lengthen the lease"
                )
        return cls(
            models=chosen,
            using=using,
            concurrency=concurrency,
            batch=batch,
            lease=lease,
            poll=poll,
            ack_window=ack_window,
            grace=grace,
            burst=bool(burst),
            until_empty=bool(until_empty),
            max_tasks=max_tasks,
            max_runtime=max_runtime,
            worker_id=worker_id,
            reap=bool(reap),
            queue=queue,
            handlers=handlers,
            strategies=strategies,
        )


def _heartbeat_setting() -> float | None:
    """``TASKCLAIM_HEARTBEAT_INTERVAL`` validated (``None`` = a third of each lease)."""
    value = taskclaim_settings.HEARTBEAT_INTERVAL
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(
            f"TASKCLAIM_HEARTBEAT_INTERVAL must be a number of seconds or None, got {value!r}"
        )
    if value <= 0:
        raise ConfigurationError(f"TASKCLAIM_HEARTBEAT_INTERVAL must be > 0, got {value!r}")
    return float(value)


def _has_field(model: type[Model], name: str) -> bool:
    return any(f.name == name for f in model._meta.concrete_fields)


def _handler_or_none(model: type[Model]) -> Callable[[Any], Any] | None:
    return get_options(model).handler()


class _Wakeup:
    """Tokens handed to idle executor threads: one per notification, up to ``cap``."""

    def __init__(self, cap: int) -> None:
        self._cond = threading.Condition()
        self._tokens = 0
        self._cap = cap

    def wake(self, n: int = 1) -> None:
        with self._cond:
            self._tokens = min(self._cap, self._tokens + n)
            self._cond.notify(n)

    def wake_all(self) -> None:
        self.wake(self._cap)

    def wait(self, timeout: float) -> bool:
        with self._cond:
            if not self._tokens:
                self._cond.wait(timeout)
            if self._tokens:
                self._tokens -= 1
                return True
            return False


class TaskAborted(Exception):
    """A task body raised a ``BaseException`` that is not an ``Exception``
    (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, ``CancelledError``): in a
    worker that is the task's failure (retried with backoff; the original is chained in
    ``last_error``), never the end of the thread or of the process."""


class _Attempt:
    """What the handler did, so an outcome write cut by a lost connection can be redone."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class Worker:
    """Run the tasks of claimable models until stopped; see the module docstring.

    ``run()`` blocks and returns an exit code from :data:`EXIT_CODES`. Signals are
    handled only when ``run()`` is called from the main thread.
    """

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.using = config.using
        self.worker_id = config.worker_id or default_worker_id()
        self.labels = {m: m._meta.label for m in config.models}
        self._lock = threading.Lock()
        # thread name -> {id(task): task} claimed, not started (identity, not Model.__eq__:
        # membership tests stay O(1) however large the batch)
        self._pending: dict[str, dict[int, Any]] = {}
        self._running: dict[str, Any] = {}  # thread name -> task being run
        # thread name -> (first deferral time, tasks run whose completion is not written yet)
        self._acks: dict[str, tuple[float, list[Any]]] = {}
        self._lost: set[tuple[str, Any, int]] = set()
        self._reserved = 0  # rows claimed so far (for --max-tasks)
        self._processed = 0
        self._stopping = threading.Event()  # no new claims
        self._halt = threading.Event()  # helper threads end
        self._beat_wake = threading.Event()  # the heartbeat thread re-reads its deadlines
        self._main_wake = threading.Event()
        self._wake = _Wakeup(config.concurrency)
        self._poll_lock = threading.Lock()
        self._last_poll = 0.0
        self._stop_reason = ""
        self._signals = 0
        self._executors: list[threading.Thread] = []
        self._finished: set[str] = set()  # executors that ended normally (not crashed)
        self._crashes: list[float] = []  # monotonic times of executor crashes
        self._broken = False
        self._helpers: list[threading.Thread] = []
        self._listener: Any = None
        self._registry_ok = True
        self.registry_db = router.db_for_write(_worker_model())

    # -- public ---------------------------------------------------------------------
    @property
    def lease(self) -> float:
        """Seconds each claim is leased for (``--lease`` or the shortest model lease)."""
        if self.config.lease is not None:
            return float(self.config.lease)
        return min(get_options(m).lease for m in self.config.models)

    def lease_for(self, model: type[Model]) -> float:
        """Seconds the rows of ``model`` are leased for (``--lease`` or its ``ClaimMeta``)."""
        return float(self.config.lease or get_options(model).lease)

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between lease extensions: ``TASKCLAIM_HEARTBEAT_INTERVAL`` or lease / 3.

        Never more than half the shortest lease, so one missed beat does not lose a row.
        """
        configured = taskclaim_settings.HEARTBEAT_INTERVAL
        if configured:
            return min(float(configured), self.lease / 2)
        return self.lease / 3

    def describe(self) -> str:
        """The startup line: what runs where (never credentials)."""
        conn = connections[self.using]
        strategies = ",".join(
            f"{label}={self._strategy_name(m)}" for m, label in self.labels.items()
        )
        wakeup = "listen+poll" if self._use_listen() else "poll"
        return (
            f"taskclaim worker id={self.worker_id} pid={os.getpid()} "
            f"models={','.join(self.labels.values())} strategy={strategies} "
            f"concurrency={self.config.concurrency} batch={self.config.batch} "
            f"lease={self.lease:g}s database={self.using} vendor={conn.vendor} "
            f"wakeup={wakeup} poll={self.config.poll:g}s ack-window={self.config.ack_window:g}s "
            f"reap={'on' if self.config.reap else 'off'}"
            + (" burst" if self.config.burst else "")
            + (f" queue={self.config.queue}" if self.config.queue else "")
        )

    def request_stop(self, reason: str = "requested") -> None:
        """Begin a graceful stop: no new claims, unstarted rows released, grace starts."""
        if not self._stopping.is_set():
            self._stop_reason = reason
            self._stopping.set()
        self._main_wake.set()
        self._wake.wake_all()

    def run(self, announce: Callable[[], None] | None = None) -> int:
        """Run until stopped; return an exit code (see :data:`EXIT_CODES`).

        ``announce`` (e.g. printing :meth:`describe`) is called once the signal handlers
        are in place: from then on SIGTERM means a graceful stop."""
        in_main = threading.current_thread() is threading.main_thread()
        previous: dict[int, Any] = {}
        if in_main:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            if announce is not None:
                announce()
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # -- main loop --------------------------------------------------------------------
    def _run(self) -> int:
        started = time.monotonic()
        if not self._wait_for_database():
            return EXIT_OK
        if self.config.burst and self.config.reap:
            self._reap_before_burst()
        self._register()
        connections.close_all()  # the main thread needs a connection again only to stop
        if self._use_listen():
            from .notify import Listener

            self._listener = Listener(self.using, self.labels.values(), self._on_notify)
            self._listener.start()
        hb = threading.Thread(target=self._heartbeat_loop, name="taskclaim-heartbeat", daemon=True)
        self._helpers.append(hb)
        if self.config.reap:
            self._helpers.append(
                threading.Thread(target=self._reap_loop, name="taskclaim-reaper", daemon=True)
            )
        for t in self._helpers:
            t.start()
        for i in range(self.config.concurrency):
            self._start_executor(i)
        released = False
        grace_deadline: float | None = None
        code = EXIT_OK
        while True:
            self._replace_crashed_executors()
            if not any(t.is_alive() for t in self._executors):
                break
            now = time.monotonic()
            if (
                self.config.max_runtime is not None
                and not self._stopping.is_set()
                and now - started >= self.config.max_runtime
            ):
                logger.info("max runtime reached worker=%s", self.worker_id)
                self.request_stop("max-runtime")
            if self._stopping.is_set():
                if not released:
                    released = True
                    grace_deadline = now + self.config.grace
                    self._release_unstarted()
                    running = len(self._running)
                    if running:
                        logger.info(
                            "stopping worker=%s reason=%s running=%s grace=%ss",
                            self.worker_id,
                            self._stop_reason,
                            running,
                            self.config.grace,
                        )
                elif grace_deadline is not None and now >= grace_deadline:
                    code = EXIT_GRACE_EXPIRED
                    self._flush_acks()
                    self._requeue_running()
                    break
            timeout = 1.0
            if grace_deadline is not None:
                timeout = max(0.01, min(timeout, grace_deadline - now))
            self._main_wake.wait(timeout)
            self._main_wake.clear()
        if self._broken and code == EXIT_OK:
            code = EXIT_BROKEN
        self._halt.set()
        self._beat_wake.set()
        self._wake.wake_all()
        if self._listener is not None:
            self._listener.stop()
        if code == EXIT_OK:
            for t in self._helpers:
                t.join(timeout=5)
            if self._listener is not None:
                self._listener.join(timeout=3)
        self._deregister()
        logger.info(
            "worker stopped worker=%s processed=%s exit=%s", self.worker_id, self._processed, code
        )
        connections.close_all()
        return code

    def _start_executor(self, index: int) -> None:
        t = threading.Thread(target=self._executor, name=f"taskclaim-exec-{index}", daemon=True)
        if index < len(self._executors):
            self._executors[index] = t
        else:
            self._executors.append(t)
        t.start()

    def _replace_crashed_executors(self) -> None:
        """Replace each executor that died of an error (logged where it died); after
        :data:`MAX_CRASHES` within :data:`CRASH_WINDOW` seconds, stop the worker with
        :data:`EXIT_BROKEN` instead: it cannot run tasks, and a restart may help."""
        for index, t in enumerate(self._executors):
            if t.is_alive() or t.name in self._finished or self._stopping.is_set():
                continue
            now = time.monotonic()
            self._crashes = [c for c in self._crashes if now - c < CRASH_WINDOW] + [now]
            if len(self._crashes) >= MAX_CRASHES:
                logger.error(
                    "executors keep crashing worker=%s crashes=%s in %ss: stopping (exit %s)",
                    self.worker_id,
                    len(self._crashes),
                    CRASH_WINDOW,
                    EXIT_BROKEN,
                )
                self._broken = True
                self.request_stop("executors crashing")
                return
            logger.warning("replacing crashed executor %s worker=%s", t.name, self.worker_id)
            self._finished.discard(t.name)
            self._start_executor(index)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals > 1:
            logger.warning(
                "second %s: exiting now worker=%s (leases recover the held rows)",
                name,
                self.worker_id,
            )
            for handler in logging.getLogger().handlers + logger.handlers:
                try:
                    handler.flush()
                except Exception:
                    pass
            sys.stderr.flush()
            os._exit(EXIT_FORCED)
        logger.info("%s received: stopping worker=%s", name, self.worker_id)
        self.request_stop(name)

    def _on_notify(self, label: str | None) -> None:
        if label is None:
            self._wake.wake_all()
        else:
            self._wake.wake(1)

    def _use_listen(self) -> bool:
        """LISTEN on PostgreSQL unless no model notifies or a transaction pooler is in front.

        (A pgBouncer in transaction mode does not keep a LISTEN session.)
        """
        if taskclaim_settings.POOLER_MODE == "transaction":
            return False
        return connections[self.using].vendor == "postgresql" and any(
            get_options(m).notify for m in self.config.models
        )

    def _strategy_name(self, model: type[Model]) -> str:
        try:
            return resolve(self.config.strategies.get(model) or "auto", self.using).name
        except Exception:
            return self.config.strategies.get(model) or "auto"

    def _wait_for_database(self) -> bool:
        """Connect (retrying with backoff during an outage); False if stopped meanwhile."""
        failures = 0
        while not self._stopping.is_set():
            try:
                connections[self.using].ensure_connection()
                if failures:
                    logger.info("database reachable worker=%s", self.worker_id)
                return True
            except DatabaseError as exc:
                failures += 1
                delay = self._backoff(failures)
                log = logger.warning if failures == 1 else logger.debug
                log(
                    "database unreachable worker=%s error=%s retry_in=%.1fs",
                    self.worker_id,
                    _one_line(exc),
                    delay,
                )
                _close(self.using)
                self._main_wake.wait(delay)
                self._main_wake.clear()
        return False

    @staticmethod
    def _backoff(failures: int) -> float:
        return min(15.0, 0.25 * 2 ** min(failures, 8)) * random.uniform(0.5, 1.5)

    # -- executors ----------------------------------------------------------------------
    def _queryset(self, model: type[Model]) -> Any:
        manager = model._default_manager.db_manager(self.using)
        qs = manager.all()
        if not hasattr(qs, "claim"):
            qs = ClaimQuerySet(model=model, using=self.using)
        if self.config.queue is not None:
            qs = qs.filter(queue_name=self.config.queue)
        return qs

    def _work_left(self) -> bool:
        """``--until-empty``: whether any served row is still ``ready`` (scheduled for
        later, e.g. a retry) or ``processing`` (held by a worker)."""
        for model in self.config.models:
            opts = get_options(model)
            pending = self._queryset(model).filter(
                opts.status_q("ready") | opts.status_q("processing")
            )
            if pending.exists():
                return True
        return False

    def leftover(self) -> str:
        """One line for the end of a ``--burst`` run: what is left, by state, and when the
        next scheduled row comes due (database clock)."""
        from django.db.models import Min

        from .monitoring import db_now

        parts = []
        now = db_now(self.using)
        for model in self.config.models:
            opts = get_options(model)
            qs = self._queryset(model)
            ready = qs.filter(opts.status_q("ready"))
            stats = qs.stats()  # one GROUP BY, counts per state
            counts = {k: stats.get(k, 0) for k in ("ready", "processing", "failed")}
            text = " ".join(f"{k}={v}" for k, v in counts.items())
            if counts["ready"] and opts.has("run_after"):
                due = ready.filter(run_after__gt=now).aggregate(m=Min("run_after"))["m"]
                if due is not None:
                    text += f" (next due in {(due - now).total_seconds():.1f}s)"
                else:
                    text += " (due now)"
            parts.append(f"{self.labels[model]}: {text}")
        return "burst finished; left: " + "; ".join(parts)

    def _quota(self) -> int:
        """How many rows this thread may claim now (0 = stop claiming)."""
        if self._stopping.is_set():
            return 0
        n = self.config.batch
        if self.config.max_tasks is not None:
            with self._lock:
                left = self.config.max_tasks - self._reserved
                n = max(0, min(n, left))
                self._reserved += n
        return n

    def _unreserve(self, n: int) -> None:
        if self.config.max_tasks is not None and n:
            with self._lock:
                self._reserved -= n

    def _executor(self) -> None:
        me = threading.current_thread().name
        try:
            self._executor_loop(me)
            self._finished.add(me)
        except BaseException as exc:  # never silently: logged, then replaced by the main loop
            logger.error(
                "executor crashed thread=%s worker=%s error=%s",
                me,
                self.worker_id,
                _one_line(exc),
                exc_info=exc,
            )
        finally:
            self._main_wake.set()

    def _executor_loop(self, me: str) -> None:
        order = list(self.config.models)
        random.shuffle(order)
        rr = 0
        failures = 0
        try:
            while not self._stopping.is_set():
                want = self._quota()
                if want == 0:
                    if self.config.max_tasks is not None and not self._stopping.is_set():
                        self._main_wake.set()  # budget used up: this thread is done
                    break
                rows: list[Any] = []
                model = order[0]
                try:
                    for i in range(len(order)):
                        model = order[(rr + i) % len(order)]
                        rows = self._queryset(model).claim(
                            want, lease=self.lease_for(model), worker=self.worker_id
                        )
                        if rows:
                            break
                    rr += 1
                except DatabaseError as exc:
                    self._unreserve(want)
                    failures += 1
                    self._db_trouble("claim", exc, failures)
                    continue
                if failures:
                    logger.info("database reachable again worker=%s", self.worker_id)
                    failures = 0
                self._unreserve(want - len(rows))
                if not rows:
                    self._flush_acks(me)
                    if self.config.burst and not (self.config.until_empty and self._work_left()):
                        break
                    self._idle()
                    continue
                if len(rows) == want and want == self.config.batch:
                    self._wake.wake(1)  # more may be waiting: let an idle sibling look
                with self._lock:
                    self._pending[me] = {id(r): r for r in rows}
                rows = self._isolate_recovered(me, rows)
                self._run_batch(me, model, rows)
        finally:
            try:
                self._flush_acks(me)
            finally:
                with self._lock:
                    leftover = list(self._pending.pop(me, {}).values())
                if leftover:
                    self._release(leftover)
                connections.close_all()  # this thread's connections only

    def _idle(self) -> None:
        """Wait for a notification or the (jittered) poll interval, whichever is first."""
        poll = self.config.poll
        while not self._stopping.is_set():
            if self._wake.wait(poll * random.uniform(0.75, 1.25)):
                return
            with self._poll_lock:  # one idle thread polls per interval, not all of them
                now = time.monotonic()
                if now - self._last_poll >= poll * 0.5:
                    self._last_poll = now
                    return

    def _isolate_recovered(self, me: str, rows: list[Any]) -> list[Any]:
        """Order a claimed batch so a recovered row (see
        :func:`~django_taskclaim.strategies.was_recovered`) runs alone: last, after every
        completion buffered in this process is written. Further recovered rows of the
        batch are given back at once (attempt not counted, still marked recovered): each
        gets its own turn. So when a task kills its worker again, it is charged the
        attempt, and the rows claimed with it are not.
        """
        recovered = [r for r in rows if was_recovered(r)]
        if not recovered or len(rows) == 1:
            return rows
        keep, extra = recovered[0], recovered[1:]
        if extra:
            with self._lock:
                pending = self._pending.get(me, {})
                for task in extra:
                    pending.pop(id(task), None)
            self._give_back_recovered(extra)
        return [r for r in rows if not was_recovered(r)] + [keep]

    def _give_back_recovered(self, tasks: list[Any]) -> None:
        """Release claimed-but-unstarted recovered rows, keeping their recovered mark."""
        for task in tasks:
            opts = get_options(task)
            try:
                hit = (
                    type(task)
                    ._base_manager.using(task._state.db or self.using)
                    .filter(pk=task.pk, version=task.version)
                    .filter(opts.status_q("processing"))
                    .update(
                        **{
                            opts.status_field: opts.value("ready"),
                            "version": F("version") + 1,
                            "attempts": F("attempts") - 1,
                        }
                    )
                )
            except DatabaseError as exc:
                _close(self.using)
                hit = 0
                logger.warning(
                    "could not give back task=%s:%s worker=%s error=%s (its lease will expire)",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                    _one_line(exc),
                )
            if hit:
                logger.info(
                    "recovered task=%s:%s given back to run alone worker=%s",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                )

    def _run_batch(self, me: str, model: type[Model], rows: list[Any]) -> None:
        handler = self.config.handlers[model]
        for task in rows:
            with self._lock:
                pending = self._pending.get(me, {})
                if id(task) not in pending:
                    continue  # released at shutdown, or found lost by the heartbeat
                if self._stopping.is_set():
                    return  # the rest stays pending: released by the main thread or below
            if was_recovered(task):
                # It may be the task that killed a worker: nothing else of this process
                # may be lost with it. (A claimed but unstarted row stays pending here.)
                self._flush_acks()
            with self._lock:
                if id(task) not in pending or self._stopping.is_set():
                    continue
                del pending[id(task)]
                self._running[me] = task
            try:
                self._run_one(me, model, task, handler)
            finally:
                with self._lock:
                    self._running.pop(me, None)
                    self._processed += 1
            self._flush_acks(me, due_only=True)

    # -- batched acknowledgements -------------------------------------------------------
    def _defer(self, me: str) -> Callable[[Any], None] | None:
        """The ``defer`` hook of :func:`run_task`: buffer a completion for one UPDATE."""
        if not self.config.ack_window:
            return None

        def defer(task: Any) -> None:
            with self._lock:
                entry = self._acks.get(me)
                if entry is None:
                    entry = self._acks[me] = (time.monotonic(), [])
                    self._beat_wake.set()  # a new deadline for the heartbeat thread
                entry[1].append(task)

        return defer

    def _flush_acks(self, me: str | None = None, *, due_only: bool = False) -> None:
        """Write buffered completions (``me``'s, or every thread's) in one fenced UPDATE.

        With ``due_only``, only when the oldest waited ``ack_window`` or the buffer is
        a full claim batch. A database error is retried until the connection is back;
        the write is fenced and its outcome checked, so a repeat is harmless.
        """
        with self._lock:
            names = [me] if me is not None else list(self._acks)
            tasks: list[Any] = []
            for name in names:
                entry = self._acks.get(name)
                if not entry:
                    continue
                since, buffered = entry
                if due_only and (
                    time.monotonic() - since < self.config.ack_window
                    and len(buffered) < max(self.config.batch, 100)
                ):
                    continue
                del self._acks[name]
                tasks.extend(buffered)
        if not tasks:
            return
        failures = 0
        while True:
            try:
                lost = complete_many(tasks)
                break
            except DatabaseError as exc:
                if not _connection_trouble(exc):
                    # Not an outage: the batched statement itself fails (a pk type or
                    # a backend it does not suit). Never retried as is: one by one.
                    logger.error(
                        "batched completion failed tasks=%s worker=%s error=%s: "
                        "writing them one by one",
                        len(tasks),
                        self.worker_id,
                        _one_line(exc),
                        exc_info=exc,
                    )
                    _close(self.using)
                    lost = self._complete_one_by_one(tasks)
                    break
                failures += 1
                _close(self.using)
                log = logger.warning if failures == 1 else logger.debug
                log(
                    "database error while recording completions tasks=%s worker=%s error=%s",
                    len(tasks),
                    self.worker_id,
                    _one_line(exc),
                )
                if self._halt.wait(self._backoff(failures)):
                    logger.warning(
                        "completions not recorded tasks=%s worker=%s (their leases will "
                        "expire and they will run again)",
                        len(tasks),
                        self.worker_id,
                    )
                    return
        for task in tasks:
            if task not in lost:
                logger.debug(
                    "task done task=%s:%s model=%s attempt=%s worker=%s",
                    type(task)._meta.label,
                    task.pk,
                    type(task)._meta.label,
                    task.attempts,
                    self.worker_id,
                )

    def _complete_one_by_one(self, tasks: list[Any]) -> list[Any]:
        """Fenced ``complete()`` per task (the fallback of a failing batched write);
        return the tasks not completed. Errors are logged, never retried forever: a
        task left unwritten is recovered after its lease like any lost completion."""
        from . import lifecycle

        left: list[Any] = []
        for task in tasks:
            try:
                lifecycle.complete_pending(task)
            except ClaimLost:
                left.append(task)
            except DatabaseError as exc:
                left.append(task)
                _close(self.using)
                logger.error(
                    "completion not recorded task=%s:%s worker=%s error=%s "
                    "(its lease will expire and it will run again)",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                    _one_line(exc),
                )
        return left

    def _run_one(
        self, me: str, model: type[Model], task: Any, handler: Callable[[Any], Any]
    ) -> None:
        label = self.labels[model]
        attempt = _Attempt()
        # ClaimMeta.atomic: the completion commits with the handler's writes, so a
        # database error there means neither landed; never re-write "done" alone.
        atomic = get_options(model).atomic

        def wrapped(row: Any) -> Any:
            try:
                result = async_to_sync(handler)(row) if _is_async(handler) else handler(row)
            except Exception as exc:
                attempt.error = exc
                raise
            except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit…
                # The task's failure, retried like any error; never the executor's end.
                aborted = TaskAborted(
                    f"the task raised {type(exc).__name__}"
                    + (f"({exc})" if str(exc) else "")
                    + ": it is treated as the task's failure"
                )
                attempt.error = aborted
                raise aborted from exc
            attempt.done = not atomic
            attempt.result = result
            return result

        started = time.monotonic()
        logger.debug(
            "task started task=%s:%s model=%s attempt=%s worker=%s",
            label,
            task.pk,
            label,
            task.attempts,
            self.worker_id,
        )
        try:
            outcome = run_task(task, wrapped, defer=self._defer(me))
        except DatabaseError as exc:
            outcome = self._settle_after_error(task, attempt, exc)
        except Exception as exc:
            logger.error(
                "task could not be settled task=%s:%s model=%s attempt=%s worker=%s error=%s",
                label,
                task.pk,
                label,
                task.attempts,
                self.worker_id,
                _one_line(exc),
                exc_info=exc,
            )
            outcome = "error"
        took = time.monotonic() - started
        if outcome == "lost" or self._is_lost(model, task):
            logger.warning(
                "claim lost task=%s:%s model=%s attempt=%s worker=%s: its writes did not land",
                label,
                task.pk,
                label,
                task.attempts,
                self.worker_id,
            )
        if outcome == "deferred":
            return  # logged when the completion is written
        log = logger.debug if outcome == "done" else logger.info
        log(
            "task %s task=%s:%s model=%s attempt=%s worker=%s duration=%.3fs",
            outcome,
            label,
            task.pk,
            label,
            task.attempts,
            self.worker_id,
            took,
        )

    def _settle_after_error(self, task: Any, attempt: _Attempt, exc: BaseException) -> str:
        """Record the outcome of a task whose outcome write hit a database error.

        The handler's result is known (``attempt``), so once the connection is back the
        same fenced write is made again; a ``ClaimLost`` then means it had landed (or the
        row was taken back) and nothing more is written.
        """
        from . import lifecycle

        label = type(task)._meta.label
        failures = 0
        while True:
            if not _connection_trouble(exc):
                logger.error(
                    "task outcome not recorded task=%s:%s model=%s worker=%s error=%s",
                    label,
                    task.pk,
                    label,
                    self.worker_id,
                    _one_line(exc),
                )
                return "error"
            failures += 1
            _close(self.using)
            log = logger.warning if failures == 1 else logger.debug
            log(
                "database error while recording outcome task=%s:%s worker=%s error=%s",
                label,
                task.pk,
                self.worker_id,
                _one_line(exc),
            )
            if self._halt.wait(self._backoff(failures)):
                return "abandoned"
            try:
                opts = get_options(task)
                if opts.state_of(getattr(task, opts.status_field)) != "processing":
                    return opts.state_of(getattr(task, opts.status_field)) or "unknown"
                err = attempt.error
                if attempt.done:
                    result = attempt.result
                    lifecycle.complete(
                        task, **(dict(result) if isinstance(result, Mapping) else {})
                    )
                    after = getattr(result, "on_written", None)
                    if after is not None:
                        after()
                    return "done"
                if isinstance(err, Retry):
                    return lifecycle.retry(task, delay=err.delay, error=err.reason or "retry")
                if isinstance(err, Fail):
                    lifecycle.fail(task, err.reason)
                    return "failed"
                return lifecycle.retry(task, error=err or exc)
            except ClaimLost:
                return "lost"
            except DatabaseError as again:
                exc = again

    def _db_trouble(self, what: str, exc: BaseException, failures: int) -> None:
        _close(self.using)
        delay = self._backoff(failures)
        log = logger.warning if failures == 1 else logger.debug
        log(
            "database error during %s worker=%s error=%s retry_in=%.1fs",
            what,
            self.worker_id,
            _one_line(exc),
            delay,
        )
        self._stopping.wait(delay)

    # -- lost claims, release, requeue -----------------------------------------------------
    def _is_lost(self, model: type[Model], task: Any) -> bool:
        with self._lock:
            return (self.labels[model], task.pk, task.version) in self._lost

    def _release(self, tasks: Iterable[Any]) -> int:
        """Give claimed-but-unstarted rows back (attempt not counted); return how many."""
        done = 0
        models_touched: set[type[Model]] = set()
        for task in tasks:
            try:
                task.release()
                done += 1
                models_touched.add(type(task))
            except ClaimLost:
                pass
            except DatabaseError as exc:
                logger.warning(
                    "could not release task=%s:%s worker=%s error=%s (its lease will expire)",
                    type(task)._meta.label,
                    task.pk,
                    self.worker_id,
                    _one_line(exc),
                )
                _close(self.using)
        if done:
            logger.info("released unstarted tasks=%s worker=%s", done, self.worker_id)
            self._notify_ready(models_touched)
        return done

    def _release_unstarted(self) -> None:
        with self._lock:
            tasks = [t for rows in self._pending.values() for t in rows.values()]
            for rows in self._pending.values():
                rows.clear()
        if tasks:
            self._release(tasks)

    def _requeue_running(self) -> None:
        """After the grace period: give running rows back (this attempt counts)."""
        with self._lock:
            running = [copy.copy(t) for t in self._running.values()]
        for task in running:
            label = type(task)._meta.label
            logger.warning(
                "grace period over, task still running task=%s:%s model=%s attempt=%s "
                "worker=%s: requeued",
                label,
                task.pk,
                label,
                task.attempts,
                self.worker_id,
            )
            try:
                task.retry(delay=0, error=f"worker {self.worker_id} stopped after its grace period")
            except ClaimLost:
                pass
            except DatabaseError as exc:
                logger.warning(
                    "could not requeue task=%s:%s error=%s", label, task.pk, _one_line(exc)
                )
        self._notify_ready({type(t) for t in running})

    def _notify_ready(self, touched: Iterable[type[Model]]) -> None:
        from .notify import notify

        for model in touched:
            try:
                notify(model, using=self.using)
            except DatabaseError:
                _close(self.using)

    # -- heartbeat and registry ---------------------------------------------------------------
    def _held(self) -> dict[type[Model], list[tuple[Any, SimpleNamespace]]]:
        out: dict[type[Model], list[tuple[Any, SimpleNamespace]]] = {}
        with self._lock:
            tasks = [t for rows in self._pending.values() for t in rows.values()]
            # A running task of a ClaimMeta.atomic model holds its row's lock in its own
            # transaction: extending it would block this thread (and every other row's
            # heartbeat) until the body ends. Its body must finish within the lease.
            tasks += [t for t in self._running.values() if not get_options(type(t)).atomic]
            tasks += [t for _since, rows in self._acks.values() for t in rows]
            for t in tasks:
                snap = SimpleNamespace(pk=t.pk, version=t.version)
                out.setdefault(type(t), []).append((t, snap))
        return out

    def _heartbeat_loop(self) -> None:
        """Extend leases every ``heartbeat_interval``; in between, write buffered
        completions as each buffer's ``ack_window`` runs out (so the window is a bound
        even while the thread that buffered them runs a long task)."""
        failures = 0
        interval = self.heartbeat_interval
        touch_every = min(interval, REGISTRY_INTERVAL)
        next_beat = time.monotonic() + interval
        next_touch = time.monotonic() + touch_every
        while not self._halt.is_set():
            due = self._acks_due_at()
            wake_at = min(next_beat, next_touch) if due is None else min(next_beat, next_touch, due)
            self._beat_wake.wait(max(0.0, wake_at - time.monotonic()))
            self._beat_wake.clear()
            if self._halt.is_set():
                break
            try:  # this thread never dies: leases of running tasks depend on it
                if due is not None and time.monotonic() >= due:
                    self._flush_acks(due_only=True)
                now = time.monotonic()
                if now >= next_beat:
                    self._heartbeat()
                    next_beat = time.monotonic() + interval
                    next_touch = time.monotonic() + touch_every
                    if failures:
                        logger.info("heartbeat resumed worker=%s", self.worker_id)
                    failures = 0
                elif now >= next_touch:
                    self._touch_registry()
                    next_touch = time.monotonic() + touch_every
            except Exception as exc:
                failures += 1
                trouble = isinstance(exc, DatabaseError)
                log = logger.warning if failures == 1 or not trouble else logger.debug
                log(
                    "heartbeat failed worker=%s error=%s",
                    self.worker_id,
                    _one_line(exc),
                    exc_info=None if trouble else exc,
                )
                _close(self.using)
                _close(self.registry_db)
                next_beat = time.monotonic() + min(interval, 1.0)
                next_touch = next_beat
        _close(self.using)
        _close(self.registry_db)

    def _acks_due_at(self) -> float | None:
        """When the oldest buffered completion's window ends (monotonic), or None."""
        with self._lock:
            if not self._acks:
                return None
            return min(since for since, _tasks in self._acks.values()) + self.config.ack_window

    def _heartbeat(self) -> None:
        for model, held in self._held().items():
            snaps = [s for _t, s in held]
            lost = ClaimQuerySet(model=model, using=self.using).extend_leases(
                snaps, self.lease_for(model)
            )
            if lost:
                self._mark_lost(model, held, {(s.pk, s.version) for s in lost})
        self._touch_registry()

    def _mark_lost(
        self, model: type[Model], held: list[tuple[Any, Any]], lost: set[tuple[Any, int]]
    ) -> None:
        label = self.labels.get(model, model._meta.label)
        opts = get_options(model)
        with self._lock:
            for task, snap in held:
                if (snap.pk, snap.version) not in lost or task.version != snap.version:
                    continue  # finished (token moved on) since the snapshot
                if opts.state_of(getattr(task, opts.status_field)) != "processing":
                    continue
                self._lost.add((label, task.pk, task.version))
                for rows in self._pending.values():
                    if id(task) in rows:
                        del rows[id(task)]
                        logger.warning(
                            "claim lost before start task=%s:%s model=%s worker=%s: skipped",
                            label,
                            task.pk,
                            label,
                            self.worker_id,
                        )
                        break
                else:
                    logger.warning(
                        "claim lost while running task=%s:%s model=%s attempt=%s worker=%s: "
                        "its later writes will not land",
                        label,
                        task.pk,
                        label,
                        task.attempts,
                        self.worker_id,
                    )

    def _register(self) -> None:
        model = _worker_model()
        fields = {
            "hostname": socket.gethostname()[:255],
            "pid": os.getpid(),
            "model_labels": sorted(self.labels.values()),
            "concurrency": self.config.concurrency,
            "in_flight": 0,
            "processed": self._processed,
            "stopped_at": None,
        }
        try:
            qs = model._default_manager.using(self.registry_db).filter(worker_id=self.worker_id)
            prior = qs.filter(
                stopped_at__isnull=True,
                last_seen__gte=DbNow() - timedelta(seconds=silent_after()),
            ).exists()
            if prior:
                logger.warning(
                    "worker id %s is registered as alive: another process may use the same "
                    "--worker-id",
                    self.worker_id,
                )
            if not qs.update(started_at=DbNow(), last_seen=DbNow(), **fields):
                model._default_manager.using(self.registry_db).create(
                    worker_id=self.worker_id, **fields
                )
        except DatabaseError as exc:
            _close(self.registry_db)
            if _connection_trouble(exc):
                return  # registered by the next heartbeat that reaches the database
            self._registry_ok = False
            logger.warning(
                "worker registry unavailable worker=%s error=%s (run migrate); continuing without",
                self.worker_id,
                _one_line(exc),
            )

    def _touch_registry(self) -> None:
        if not self._registry_ok:
            return
        with self._lock:
            in_flight = len(self._running) + sum(len(r) for r in self._pending.values())
            processed = self._processed
        found = (
            _worker_model()
            ._default_manager.using(self.registry_db)
            .filter(worker_id=self.worker_id)
            .update(last_seen=DbNow(), in_flight=in_flight, processed=processed, stopped_at=None)
        )
        if not found:  # not registered yet (outage at start) or the row was deleted
            self._register()

    def _deregister(self) -> None:
        if not self._registry_ok:
            return
        try:
            _worker_model()._default_manager.using(self.registry_db).filter(
                worker_id=self.worker_id
            ).update(last_seen=DbNow(), stopped_at=DbNow(), in_flight=0, processed=self._processed)
        except DatabaseError as exc:
            logger.warning(
                "could not mark worker stopped worker=%s error=%s", self.worker_id, _one_line(exc)
            )

    # -- periodic reaping -------------------------------------------------------------------
    def _reap_loop(self) -> None:
        failures = 0
        while True:
            interval = float(taskclaim_settings.REAP_INTERVAL)
            if self._halt.wait(interval * random.uniform(0.8, 1.2)):
                break
            if self._stopping.is_set():
                continue
            try:
                self._reap_once(interval)
                failures = 0
            except DatabaseError as exc:
                failures += 1
                log = logger.warning if failures == 1 else logger.debug
                log("periodic reap failed worker=%s error=%s", self.worker_id, _one_line(exc))
                _close(self.using)
                _close(self.registry_db)
            except Exception as exc:
                logger.error(
                    "periodic reap failed worker=%s error=%s",
                    self.worker_id,
                    _one_line(exc),
                    exc_info=exc,
                )
        _close(self.using)
        _close(self.registry_db)

    def _reap_before_burst(self) -> None:
        """``--burst``: recover expired leases once before draining, so rows of crashed
        workers are part of what a burst run drains (``--no-reap`` skips it)."""
        try:
            result = recover(self.config.models, using=self.using)
        except DatabaseError as exc:
            _close(self.using)
            logger.warning(
                "reap before burst failed worker=%s error=%s", self.worker_id, _one_line(exc)
            )
            return
        if result.total:
            logger.info(
                "reaped before burst worker=%s requeued=%s failed=%s",
                self.worker_id,
                result.requeued,
                result.failed,
            )

    def _reap_once(self, interval: float) -> None:
        lock = _reap_lock(interval, self.worker_id, self.registry_db)
        if lock is not None and not lock.acquire():
            logger.debug(
                "reap skipped worker=%s: another worker holds the reap lock", self.worker_id
            )
            return
        # The lock is not released: it lapses after ``interval``, so one reap per
        # interval runs across all hosts.
        result = recover(self.config.models, using=self.using)
        if result.requeued:
            self._notify_ready(m for m in self.config.models)
            self._wake.wake_all()


def _is_async(fn: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def _worker_model() -> type[Model]:
    from .models import WorkerProcess

    return WorkerProcess


def _reap_lock(ttl: float, owner: str, using: str) -> Any:
    """A ``LeaseLock`` on the reap key, or ``None`` if locks are unavailable."""
    try:
        locks = importlib.import_module("django_taskclaim.locks")
    except ImportError:  # pragma: no cover - locks module missing
        return None
    return locks.LeaseLock(REAP_LOCK_KEY, ttl, owner=owner, using=using)


def silent_after() -> float:
    """Seconds of registry silence after which a worker is *shown* as silent
    (``TASKCLAIM_WORKER_SILENT_AFTER``). Display only: silence is not death, and no row
    is taken from a silent worker before its lease ends."""
    return float(taskclaim_settings.WORKER_SILENT_AFTER)


def silent_workers(*, using: str | None = None, exclude: Iterable[str] = ()) -> list[str]:
    """Ids of registered, not stopped workers not heard from for :func:`silent_after`
    seconds (database clock). For operators (stats, admin): a silent worker may be
    paused, partitioned or dead; only :func:`~django_taskclaim.reaper.release_worker`,
    called by someone who knows it is dead, frees its rows before their leases end."""
    model = _worker_model()
    db = using or router.db_for_write(model)
    return list(
        model._default_manager.using(db)
        .filter(stopped_at__isnull=True, last_seen__lt=DbNow() - timedelta(seconds=silent_after()))
        .exclude(worker_id__in=list(exclude))
        .values_list("worker_id", flat=True)
    )


def recover(
    models_: Iterable[type[Model]] = (),
    *,
    using: str | None = None,
    dry_run: bool = False,
    batch_size: int | None = None,
) -> ReapResult:
    """Recover the rows whose lease expired (database clock); see
    :func:`~django_taskclaim.reaper.reap`. Rows with a valid lease are never touched,
    whatever the worker registry says. ``dry_run`` only counts. Safe to run
    concurrently from several hosts."""
    targets = list(models_) or list(claimable_models())
    return reap(*targets, using=using, batch_size=batch_size, dry_run=dry_run)


def configure_logging(verbosity: int) -> None:
    """Map ``-v`` to the ``django_taskclaim`` logger level; add a stderr handler if none."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    root = logging.getLogger("django_taskclaim")
    root.setLevel(level)
    if not root.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root.addHandler(handler)
