"""Reading ``/proc``, written once for every benchmark (Linux only): a process's (or a
thread's) ``stat`` fields, its CPU ticks, its parent, the tree under it and its resident
memory. Used by :mod:`benchmarks.run`, :mod:`benchmarks.peers`, :mod:`benchmarks.per_job`
and :mod:`benchmarks.rss_floor`; the child scripts that measure their own memory read it
themselves, so that nothing is imported into what they measure.
"""

from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def stat_fields(pid: int | str, *, task: int | None = None) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` (``/proc/<pid>/task/<task>/stat`` for one
    thread) after the command name: field 3 (the state) is index 0, the parent 1,
    utime and stime 11 and 12, the start time 19. ``None`` once the process is gone."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        with open(path) as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_ticks(fields: list[str]) -> int:
    """User and system CPU time of ``fields`` (:func:`stat_fields`), in clock ticks."""
    return int(fields[11]) + int(fields[12])


def proc_tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    pids = [pid]
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if entry.isdigit():
            fields = stat_fields(entry)
            try:
                if fields is not None and int(fields[1]) == pid:
                    pids.extend(proc_tree(int(entry)))
            except (IndexError, ValueError):
                continue
    return pids


def tree_cpu_ticks(pids: list[int]) -> int:
    """CPU ticks of ``pids`` together (those gone count nothing)."""
    total = 0
    for pid in pids:
        fields = stat_fields(pid)
        try:
            total += cpu_ticks(fields) if fields is not None else 0
        except (IndexError, ValueError):
            continue
    return total


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (``statm``); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def vm_rss_mib(pid: int | str = "self") -> float:
    """``VmRSS`` of ``pid`` (``status``), in MiB."""
    with open(f"/proc/{pid}/status") as fh:
        return next(int(x.split()[1]) / 1024 for x in fh if x.startswith("VmRSS"))
