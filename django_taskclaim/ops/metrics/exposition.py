"""The gauges (:mod:`.gauges`) in the Prometheus text exposition format, version 0.0.4:
what the metrics view serves and ``manage.py taskclaim_metrics`` prints. Written here,
no client library needed. Each metric's ``# HELP`` and ``# TYPE`` come once, before its
samples; label values are escaped as the format says.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from django_taskclaim.ops.metrics.gauges import STATES, Gauges

__all__ = ["CONTENT_TYPE", "METRICS", "render"]

#: The ``Content-Type`` of the text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: name -> help text, in the order they are written (all gauges).
METRICS = {
    "taskclaim_tasks": "Rows of a claimable model per state (ready includes rows scheduled "
    "for later and rows parked until an event; waiting: rows waiting for prerequisites), "
    'per queue (queue "(other)": the sum of the queues past TASKCLAIM_METRICS_MAX_QUEUES).',
    "taskclaim_expired_leases": "Processing rows whose lease has expired (database clock): "
    "the next reap takes them back.",
    "taskclaim_oldest_ready_age_seconds": "Seconds since the oldest row ready to run now became "
    "ready (created, or retried / requeued; database clock); 0 when none is.",
    "taskclaim_queue_paused": "1 for each paused queue (queue empty: all of the model's queues; "
    'queue "(other)": more paused queues than TASKCLAIM_METRICS_MAX_QUEUES).',
    "taskclaim_rate_limit_starts": "Starts (claims) in the rate limit ring's current "
    "window (database clock); scope empty: the whole model.",
    "taskclaim_rate_limit": "The rate limit's N: at most this many starts in any window.",
    "taskclaim_rate_limit_keys_busy": "Keys of the model's key_rate_limit with a start in "
    "their current window (database clock).",
    "taskclaim_rate_limit_keys_at_limit": "Keys of the model's key_rate_limit at their "
    "limit: every slot used within the window.",
    "taskclaim_workers_live": "Registered workers heard from recently (not stopped).",
    "taskclaim_workers_silent": "Registered workers not stopped and not heard from for "
    "TASKCLAIM_WORKER_SILENT_AFTER seconds (shown only, never taken as dead).",
    "taskclaim_model_workers_live": "Live workers that serve the model.",
    "taskclaim_event_waits": "Rows of the model parked until an event (wait_for_event()); "
    "they count as ready rows too.",
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _sample(name: str, labels: Iterable[tuple[str, str]], value: float) -> str:
    text = ",".join(f'{key}="{_escape(val)}"' for key, val in labels)
    return f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}"


def render(gauges: Gauges) -> str:
    """``gauges`` as Prometheus text (ends with a newline). Every metric of
    :data:`METRICS` is described even when it has no sample (no paused queue)."""
    samples: dict[str, list[str]] = {name: [] for name in METRICS}
    for g in gauges.queues:
        where = (("model", g.model), ("queue", g.queue))
        for state in STATES:
            samples["taskclaim_tasks"].append(
                _sample("taskclaim_tasks", (*where, ("state", state)), getattr(g, state))
            )
        samples["taskclaim_expired_leases"].append(
            _sample("taskclaim_expired_leases", where, g.expired)
        )
        if g.oldest_ready_age is not None:
            samples["taskclaim_oldest_ready_age_seconds"].append(
                _sample("taskclaim_oldest_ready_age_seconds", where, g.oldest_ready_age)
            )
    for model, queue in gauges.paused:
        samples["taskclaim_queue_paused"].append(
            _sample("taskclaim_queue_paused", (("model", model), ("queue", queue)), 1)
        )
    for ring in gauges.rate_rings:
        where = (("model", ring.model), ("scope", ring.shown_scope))
        samples["taskclaim_rate_limit_starts"].append(
            _sample("taskclaim_rate_limit_starts", where, ring.starts)
        )
        samples["taskclaim_rate_limit"].append(_sample("taskclaim_rate_limit", where, ring.count))
    for keys in gauges.rate_keys:
        by_model = (("model", keys.model),)
        samples["taskclaim_rate_limit_keys_busy"].append(
            _sample("taskclaim_rate_limit_keys_busy", by_model, keys.busy)
        )
        samples["taskclaim_rate_limit_keys_at_limit"].append(
            _sample("taskclaim_rate_limit_keys_at_limit", by_model, keys.at_limit)
        )
    samples["taskclaim_workers_live"].append(
        _sample("taskclaim_workers_live", (), gauges.live_workers)
    )
    samples["taskclaim_workers_silent"].append(
        _sample("taskclaim_workers_silent", (), gauges.silent_workers)
    )
    for model, count in sorted(gauges.live_workers_by_model.items()):
        samples["taskclaim_model_workers_live"].append(
            _sample("taskclaim_model_workers_live", (("model", model),), count)
        )
    for model, count in sorted(gauges.event_waits.items()):
        samples["taskclaim_event_waits"].append(
            _sample("taskclaim_event_waits", (("model", model),), count)
        )
    lines: list[str] = []
    for name, text in METRICS.items():
        lines += [f"# HELP {name} {_escape_help(text)}", f"# TYPE {name} gauge", *samples[name]]
    return "\n".join(lines) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
