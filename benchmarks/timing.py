"""How the page and read benchmarks time one call: the median of repeated wall-clock runs
after one warm-up (changelist.py, dashboard.py, operator_reads.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_ms(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float]]:
    """Call ``fn`` once to warm up (template loading, the first plans), then ``repeat``
    times; return the median and every time, in milliseconds (one decimal)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 1), [round(t, 1) for t in times]
