"""A row's place in a workflow graph on its admin page (docs/workflows.md,
"Operators"): what a waiting row still waits for, and which rows wait for this one.
Each a couple of indexed reads, whatever the size of the fan-in or fan-out: counts from
the fan-in counter or a count of the edges, and the first :data:`SHOWN` rows by name."""

from __future__ import annotations

from typing import Any

from django_taskclaim.config.options import get_options
from django_taskclaim.settle.dependents import dependents, fan_in, open_prerequisites

__all__ = ["SHOWN", "dependents_text", "prerequisites_text"]

#: How many rows a line names (the rest are counted: a fan-in may wait for 100,000 rows).
SHOWN = 20


def prerequisites_text(obj: Any) -> str:
    """The prerequisites a waiting row still waits for: how many of how many are open
    (from its fan-in counter, with how the others ended), then the first :data:`SHOWN`
    by name; ``"—"`` for a row that waits for nothing."""
    counts = fan_in(obj)
    if counts is None:
        return "—"
    found = open_prerequisites(obj, limit=SHOWN)
    names = ", ".join(f"{label} #{key}" for label, key in found)
    if counts.open > len(found):
        names += f", … ({counts.open - len(found):,} more)"
    ended = ", ".join(
        f"{n:,} {state}"
        for state, n in (
            ("done", counts.done),
            ("failed", counts.failed),
            ("cancelled", counts.cancelled),
        )
        if n
    )
    head = f"{counts.open:,} of {counts.total:,} open" + (f" ({ended})" if ended else "")
    return f"{head}: {names}" if names else head


def dependents_text(obj: Any) -> str:
    """The rows that wait for ``obj``: how many still wait and the first :data:`SHOWN` by
    name, and how many it released or settled already; ``"—"`` when none ever waited
    for it (or its model does not declare ``ClaimMeta.dependents``)."""
    if not get_options(type(obj)).dependents:
        return "—"
    edges = dependents(obj)
    still = edges.filter(outcome="")
    waiting = list(still.values_list("dependent_model", "dependent_pk")[: SHOWN + 1])
    open_count = len(waiting) if len(waiting) <= SHOWN else still.count()
    settled = edges.exclude(outcome="").count()
    parts = []
    if open_count:
        names = ", ".join(f"{label} #{key}" for label, key in waiting[:SHOWN])
        more = f", … ({open_count - SHOWN:,} more)" if open_count > SHOWN else ""
        parts.append(f"{open_count:,} waiting for it: {names}{more}")
    if settled:
        parts.append(f"{settled:,} released or settled by it")
    return "; ".join(parts) or "—"
