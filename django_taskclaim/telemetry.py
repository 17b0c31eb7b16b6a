"""The worker's OpenTelemetry metrics: counters and histograms of what one worker
process does, labelled by ``model`` (``app_label.Model``) and ``queue`` (the row's
``queue_name``, ``""`` for a model without queues). See docs/observability.md.

The ``queue`` values stay bounded whatever the rows hold: per model, the first
``TASKCLAIM_METRICS_MAX_QUEUES`` queue names a process sees are their own value, every
later one is :data:`OTHER_QUEUES` (the database gauges sum theirs up under the same name).

Optional (``pip install django-taskclaim[otel]``, the ``opentelemetry-api`` package)
and free without it: :func:`instruments` returns ``None`` when ``opentelemetry`` cannot
be imported (tried once, remembered), and each worker thread keeps that value and tests
it for ``None`` before it reads a clock or builds a label; nothing else runs per job.
With the API installed the instruments record into the global ``MeterProvider``, or into
the one given to :func:`configure`; while no global provider is set (the API's
placeholder, which drops every value) a worker measures nothing either, as without the
package: set the provider before the worker starts (settings, ``AppConfig.ready()``, or
``opentelemetry-instrument``).

Callers: the claimer (claims), the executors (each attempt's outcome and body
duration), the acknowledgements (batched completions and their latency), the heartbeat
(lease renewals and losses), the worker's reaping (recoveries) and a task deadline
(:func:`timed_out`). Foundation layer: imports nothing of the package but
:mod:`~django_taskclaim.capped` (its label cache) and
:mod:`~django_taskclaim.config.settings` (the cap), so any layer may call it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from django_taskclaim.capped import CappedCache
from django_taskclaim.config.settings import taskclaim_settings

__all__ = [
    "DURATION_BUCKETS",
    "METER_NAME",
    "Instruments",
    "configure",
    "instruments",
    "timed_out",
]

#: The instrumentation scope the instruments are created under.
METER_NAME = "django_taskclaim"

#: Bucket boundaries, in seconds, of the three duration histograms (given to the SDK as
#: ``explicit_bucket_boundaries_advisory``; a View of yours overrides them). The SDK's
#: own default (0, 5, 10, 25 … 10000) is made for milliseconds: every sub-second task
#: would land in its first bucket. From half a millisecond (a claim statement) to an
#: hour (a long task body), about 2.5× apart.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip

#: The attribute of a claimed instance that holds the monotonic time its body ended,
#: while its completion waits to be written with others (for the ack latency).
ENDED_ATTR = "_taskclaim_body_ended"
#: The attribute of a claimed instance set once its lost lease was counted.
LOST_ATTR = "_taskclaim_lease_loss_counted"

#: Outcomes of an attempt (``settle.transitions.Outcome`` values) -> the counter that
#: counts them; ``done`` is counted once written (at once, or by a batched ack).
_COUNTED = {"ready": "retried", "failed": "failed", "cancelled": "cancelled", "lost": "cancelled"}


#: The ``queue`` value of every queue past ``TASKCLAIM_METRICS_MAX_QUEUES`` (per model).
OTHER_QUEUES = "(other)"


def _queue(task: Any) -> str:
    """The queue label of ``task``: its loaded ``queue_name``, else ``""`` (never a query)."""
    value = task.__dict__.get("queue_name")
    return "" if value is None else str(value)


class Instruments:
    """The worker's instruments on one OpenTelemetry ``Meter``. Every method only adds
    to counters and records to histograms; none raises for a value it is given."""

    def __init__(self, meter: Any) -> None:
        def counter(name: str, text: str) -> Any:
            return meter.create_counter(f"taskclaim.{name}", unit="{task}", description=text)

        def histogram(name: str, text: str) -> Any:
            try:
                return meter.create_histogram(
                    f"taskclaim.{name}",
                    unit="s",
                    description=text,
                    explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
                )
            except TypeError:  # an API before 1.23, which takes no advice
                return meter.create_histogram(f"taskclaim.{name}", unit="s", description=text)

        self.counters = {
            "claimed": counter("tasks.claimed", "Rows claimed by this worker."),
            "completed": counter("tasks.completed", "Attempts whose completion was written."),
            "failed": counter("tasks.failed", "Attempts that ended the row failed for good."),
            "retried": counter("tasks.retried", "Attempts that made the row ready again."),
            "cancelled": counter(
                "tasks.cancelled",
                "Attempts whose claim was taken back while held, or that cancelled the row.",
            ),
            "timed_out": counter("tasks.timed_out", "Attempts stopped by their deadline."),
            "recovered": counter(
                "tasks.recovered", "Rows whose lease had expired, recovered by this worker."
            ),
        }
        self.renewals = meter.create_counter(
            "taskclaim.lease.renewals", unit="{lease}", description="Leases renewed."
        )
        self.losses = meter.create_counter(
            "taskclaim.lease.losses",
            unit="{lease}",
            description="Held rows whose renewal found the claim taken back.",
        )
        self.claim_duration = histogram("claim.duration", "One claim statement, sent to answered.")
        self.body_duration = histogram("task.duration", "One task body, start to end.")
        self.ack_duration = histogram(
            "ack.duration", "From a body's end to its completion being written."
        )
        self._labels: CappedCache[tuple[str, ...], dict[str, str]] = CappedCache()
        #: model label -> the queue names given a value of their own (at most the cap)
        self._queues: dict[str, set[str]] = {}
        self._max_queues = int(taskclaim_settings.METRICS_MAX_QUEUES)
        self._queues_lock = threading.Lock()

    def _queue_value(self, label: str, queue: str) -> str:
        """The ``queue`` attribute of ``queue`` of model ``label``: the name itself for the
        first :data:`~django_taskclaim.config.settings.TaskClaimSettings.METRICS_MAX_QUEUES`
        names (and ``""``), :data:`OTHER_QUEUES` for every later one."""
        seen = self._queues.get(label)
        if seen is not None and queue in seen:
            return queue
        with self._queues_lock:
            seen = self._queues.setdefault(label, set())
            if queue in seen or not queue:
                return queue
            if len(seen) < self._max_queues and queue != OTHER_QUEUES:
                seen.add(queue)
                return queue
        return OTHER_QUEUES

    def _attrs(self, *pairs: str) -> dict[str, str]:
        """The attribute dict of ``(name, value, …)``, made once per distinct label set."""
        found = self._labels.get(pairs)
        if found is None:
            found = self._labels.put(pairs, dict(zip(pairs[::2], pairs[1::2], strict=True)))
        return found

    def _of(self, task: Any) -> dict[str, str]:
        label = task._meta.label
        return self._attrs("model", label, "queue", self._queue_value(label, _queue(task)))

    def claimed(self, label: str, queue: str, rows: Iterable[Any], seconds: float) -> None:
        """One claim statement of model ``label`` (the worker's ``--queue`` or ``""``)
        took ``seconds`` and returned ``rows``."""
        attrs = self._attrs("model", label, "queue", self._queue_value(label, queue))
        self.claim_duration.record(seconds, attrs)
        add = self.counters["claimed"].add
        for row in rows:
            add(1, self._of(row))

    def ran(self, task: Any, outcome: str, started: float, ended: float) -> None:
        """An attempt of ``task`` ran from ``started`` to ``ended`` (monotonic) and
        ``outcome`` (an ``Outcome`` value) was recorded; a ``deferred`` completion is
        counted by :meth:`acked` once written."""
        label = task._meta.label
        queue = self._queue_value(label, _queue(task))
        attrs = self._attrs("model", label, "queue", queue)
        by_outcome = self._attrs("model", label, "queue", queue, "outcome", str(outcome))
        self.body_duration.record(ended - started, by_outcome)
        if outcome == "done":
            self.counters["completed"].add(1, attrs)
            self.ack_duration.record(time.monotonic() - ended, attrs)
        elif outcome == "deferred":
            task.__dict__[ENDED_ATTR] = ended
        else:
            name = _COUNTED.get(str(outcome))
            if name is not None:
                self.counters[name].add(1, attrs)

    def acked(self, tasks: Iterable[Any], lost: Iterable[Any]) -> None:
        """A batched write ended: ``tasks`` but ``lost`` are completed."""
        now = time.monotonic()
        not_written = {id(t) for t in lost}
        for task in tasks:
            ended = task.__dict__.pop(ENDED_ATTR, None)
            if id(task) in not_written:
                continue
            attrs = self._of(task)
            self.counters["completed"].add(1, attrs)
            if ended is not None:
                self.ack_duration.record(now - ended, attrs)

    def leases(self, label: str, renewed: int) -> None:
        """The heartbeat renewed ``renewed`` leases of model ``label``."""
        if renewed:
            self.renewals.add(renewed, self._attrs("model", label, "queue", ""))

    def lease_lost(self, task: Any) -> None:
        """The heartbeat found the claim of held ``task`` taken back (counted once per
        claim: every later beat finds it again)."""
        if task.__dict__.get(LOST_ATTR):
            return
        task.__dict__[LOST_ATTR] = True
        self.losses.add(1, self._of(task))

    def recovered(self, per_model: Mapping[str, Mapping[str, int]]) -> None:
        """A reap run by this worker: ``{label: {"requeued": n, "failed": m}}``."""
        for label, counts in per_model.items():
            for key, to in (("requeued", "ready"), ("failed", "failed")):
                if counts.get(key):
                    self.counters["recovered"].add(
                        counts[key], self._attrs("model", label, "queue", "", "to", to)
                    )

    def count_timeout(self, task: Any) -> None:
        """``task``'s attempt was stopped by its deadline."""
        self.counters["timed_out"].add(1, self._of(task))


_lock = threading.Lock()
_UNSET: Any = object()
_current: Instruments | None = _UNSET


def instruments() -> Instruments | None:
    """The worker's instruments, or ``None`` when OpenTelemetry is not installed (then
    nothing is recorded and callers skip every measurement). Made once per process, on
    first use; :func:`configure` replaces them."""
    current = _current
    if current is _UNSET:
        return configure()
    return current


def configure(meter_provider: Any = None) -> Instruments | None:
    """Record into ``meter_provider`` (an OpenTelemetry ``MeterProvider``; default: the
    global one, ``opentelemetry.metrics.get_meter_provider()``) from now on; return the
    new instruments, or ``None`` when there is nothing to record into: ``opentelemetry``
    is not installed, or no global provider was set (the API's default placeholder,
    whose instruments drop every value, would cost a worker a few per cent of its time
    per job for nothing). A global provider set later is taken by the next worker to
    start (no answer is kept until one is set). Workers started afterwards use these
    instruments (one started before keeps the ones it took)."""
    global _current
    with _lock:
        try:
            from opentelemetry import metrics
        except ImportError:
            _current = None
            return None
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        if meter_provider is None and _placeholder(provider, metrics):
            _current = _UNSET  # asked again by the next worker: a provider may be set then
            return None
        _current = Instruments(provider.get_meter(METER_NAME))
        return _current


def _placeholder(provider: Any, metrics: Any) -> bool:
    """Whether ``provider`` records nothing: the API's no-op provider, or its proxy
    that stands in while no global provider is set (a private class: named, not
    imported, so that an API without it still works)."""
    return isinstance(provider, metrics.NoOpMeterProvider) or (
        type(provider).__name__ == "_ProxyMeterProvider"
    )


def timed_out(task: Any) -> None:
    """Count one attempt of ``task`` stopped by its deadline (``taskclaim.tasks.timed_out``;
    the attempt's failure is counted by its outcome as well). Nothing when OpenTelemetry
    is absent."""
    current = instruments()
    if current is not None:
        current.count_timeout(task)
