"""The lab: its tables filled, N forked claimer processes racing, claims counted.

:class:`RaceLab` fills the lab's task table with M ready rows and lets N forked claimer
processes drain it with one technique at a time. Every claim is recorded; a row handed
out more than once is a **double claim**. The tables come from the app's migration; the
lab empties them before each technique and after the run.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, IntegrityError, connections

from django_taskclaim.contrib.racelab.apps import LABEL
from django_taskclaim.contrib.racelab.models import LAB_MODELS, LabTask
from django_taskclaim.contrib.racelab.report import LabResult
from django_taskclaim.contrib.racelab.techniques import (
    TECHNIQUES,
    Context,
    Technique,
    get_technique,
)
from django_taskclaim.db import is_transient
from django_taskclaim.exceptions import ConfigurationError

logger = logging.getLogger("django_taskclaim.racelab")


class _RetryCounter(logging.Handler):
    """Counts the library's ``retrying …`` log records (retries inside a claim)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("retrying"):
            self.count += 1


def _claimer(
    technique_name: str,
    ctx: Context,
    barrier: Any,
    results: Any,
    deadline_s: float,
) -> None:
    """Body of one forked claimer: drain the table with the technique, report to ``results``."""
    # Our strategies retry transient errors inside the library and log each retry.
    counter = _RetryCounter()
    db_logger = logging.getLogger("django_taskclaim.db")
    db_logger.addHandler(counter)
    db_logger.setLevel(logging.DEBUG)
    db_logger.propagate = False
    technique = get_technique(technique_name)
    claimed: list[int] = []
    error = ""
    start = end = time.monotonic()
    try:
        barrier.wait(timeout=60)
        start = time.monotonic()
        deadline = start + deadline_s
        idle = 0
        while time.monotonic() < deadline:
            try:
                got = technique.take(ctx, claimed.extend)
            except DatabaseError as exc:
                if isinstance(exc, IntegrityError) or is_transient(exc, ctx.using):
                    ctx.retried += 1
                    continue
                raise
            if got:
                idle = 0
                continue
            if not ctx.tasks().filter(status="ready").exists():
                break
            idle += 1  # ready rows remain but others hold them: try again shortly
            time.sleep(min(0.05, 0.001 * idle))
        end = time.monotonic()
    except Exception as exc:  # reported to the parent, which prints it
        end = time.monotonic()
        error = f"{type(exc).__name__}: {exc}"
    finally:
        connections.close_all()
    results.put(
        {
            "claimed": claimed,
            "retried": ctx.retried + counter.count,
            "lost": ctx.lost,
            "start": start,
            "end": end,
            "error": error,
            "timed_out": not error and end >= start + deadline_s,
        }
    )


class RaceLab:
    """Runs techniques against the lab's tables on database ``using``.

    Guarantee: the lab's tables (created by ``migrate``) are empty again once :meth:`run`
    returns or raises; nothing else in the database is touched. The lab
    creates rows and lets ``processes`` forked claimers drain them; each claim is
    recorded, so ``double_claims`` counts every extra hand-out of a row and
    ``never_claimed`` every row no claimer got before the run ended.
    """

    def __init__(
        self,
        *,
        using: str = "default",
        processes: int = 4,
        rows: int = 2000,
        batch: int = 1,
        work: float = 0.0,
        window: float = 0.0,
        timeout: float = 120.0,
    ) -> None:
        self.using = using
        self.processes = processes
        self.rows = rows
        self.batch = batch
        self.work = work
        self.window = window
        self.timeout = timeout

    # -- the lab's tables --
    def check_tables(self) -> None:
        """Raise :class:`ConfigurationError` naming the ``migrate`` to run unless every
        lab table exists on the lab's database."""
        existing = set(connections[self.using].introspection.table_names())
        missing = [m._meta.db_table for m in LAB_MODELS if m._meta.db_table not in existing]
        if missing:
            raise ConfigurationError(
                f"the race lab's tables are missing on database {self.using!r} "
                f"({', '.join(missing)}); run: manage.py migrate {LABEL} --database {self.using}"
            )

    def empty_tables(self) -> None:
        """Delete every row of the lab's tables (rows of an interrupted run included)."""
        for model in LAB_MODELS:
            model._base_manager.using(self.using).all().delete()

    def _fill(self) -> None:
        self.empty_tables()
        LabTask.objects.using(self.using).bulk_create(
            [LabTask() for _ in range(self.rows)], batch_size=1000
        )

    # -- running --
    def run(
        self,
        techniques: Iterable[str] | None = None,
        *,
        on_result: Callable[[LabResult], None] | None = None,
    ) -> list[LabResult]:
        """Run each technique (default: all) in turn; return one result per technique.

        Raises :class:`ConfigurationError` before anything runs when the lab's tables
        were not migrated on its database."""
        names = list(techniques) if techniques is not None else list(TECHNIQUES)
        chosen = [get_technique(n) for n in names]
        results: list[LabResult] = []
        self.check_tables()
        try:
            for technique in chosen:
                result = self.run_one(technique)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        finally:
            self.empty_tables()
        return results

    def run_one(self, technique: Technique) -> LabResult:
        """Run one technique on freshly filled lab tables (which must exist)."""
        result = LabResult(technique.name, technique.kind)
        reason = technique.unsupported(self.using)
        if reason:
            result.skipped = reason
            return result
        self._fill()
        ids = set(LabTask.objects.using(self.using).values_list("pk", flat=True))
        connections.close_all()  # children open their own connections
        mp = multiprocessing.get_context("fork")
        barrier = mp.Barrier(self.processes)
        queue = mp.Queue()
        host = socket.gethostname()
        procs = []
        for i in range(self.processes):
            ctx = Context(
                using=self.using,
                worker=f"{host}:lab-{os.getpid()}-{i}",
                batch=self.batch,
                work=self.work,
                window=self.window,
            )
            proc = mp.Process(
                target=_claimer,
                args=(technique.name, ctx, barrier, queue, self.timeout),
                daemon=True,
            )
            proc.start()
            procs.append(proc)
        reports = []
        try:
            for _ in procs:
                reports.append(queue.get(timeout=self.timeout + 90))
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():  # pragma: no cover - a wedged claimer
                    proc.kill()
                    proc.join()
        counts: Counter[int] = Counter()
        for report in reports:
            counts.update(report["claimed"])
            result.retried_errors += report["retried"]
            result.lost += report["lost"]
            if report["error"]:
                result.errors.append(report["error"])
            if report["timed_out"]:
                result.errors.append(f"timed out after {self.timeout:g}s")
        result.claims = sum(counts.values())
        result.double_claims = sum(n - 1 for n in counts.values() if n > 1)
        result.never_claimed = len(ids - set(counts))
        result.seconds = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        logger.info(
            "racelab technique=%s claims=%s doubles=%s never=%s retried=%s seconds=%.3f",
            technique.name,
            result.claims,
            result.double_claims,
            result.never_claimed,
            result.retried_errors,
            result.seconds,
        )
        return result
