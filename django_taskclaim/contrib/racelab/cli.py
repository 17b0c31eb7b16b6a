"""What ``manage.py taskclaim_racelab`` does once its arguments are parsed.

:func:`build_lab` checks the options and builds the :class:`~.lab.RaceLab`;
:func:`run_and_report` runs it and writes the table (or JSON). The command turns a
:class:`~django_taskclaim.exceptions.ConfigurationError` into a ``CommandError``, and a
non-empty list of unsafe techniques into a failing exit status.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from django.db import connections

from django_taskclaim.contrib.racelab.lab import RaceLab
from django_taskclaim.contrib.racelab.report import format_table
from django_taskclaim.contrib.racelab.techniques import technique_names
from django_taskclaim.exceptions import ConfigurationError


def build_lab(
    *,
    using: str,
    processes: int,
    rows: int,
    batch: int,
    work_ms: float,
    window_ms: float,
    timeout: float,
    techniques: Sequence[str] = (),
) -> RaceLab:
    """A :class:`RaceLab` for these options, or ``ConfigurationError`` naming the bad one.

    Guarantee: ``processes``, ``rows`` and ``batch`` are at least 1, the two pauses are
    not negative, ``timeout`` is positive, ``using`` is a configured database alias and
    every name in ``techniques`` is one ``--technique`` accepts, and the lab's tables
    exist there (else the error names the ``migrate`` to run); nothing runs here.
    """
    for name, value in (("processes", processes), ("rows", rows), ("batch", batch)):
        if value < 1:
            raise ConfigurationError(f"--{name} must be at least 1, got {value}")
    for name, pause in (("work-ms", work_ms), ("window-ms", window_ms)):
        if pause < 0:
            raise ConfigurationError(f"--{name} must be >= 0")
    if timeout <= 0:
        raise ConfigurationError("--timeout must be a positive number of seconds")
    if using not in connections:
        raise ConfigurationError(
            f"unknown database {using!r}; configured: {', '.join(connections)}"
        )
    known = technique_names()
    for name in techniques:
        if name not in known:
            raise ConfigurationError(f"unknown technique {name!r}; choose from {', '.join(known)}")
    lab = RaceLab(
        using=using,
        processes=processes,
        rows=rows,
        batch=batch,
        work=work_ms / 1000,
        window=window_ms / 1000,
        timeout=timeout,
    )
    lab.check_tables()
    return lab


def run_and_report(
    lab: RaceLab,
    techniques: Sequence[str] | None,
    *,
    as_json: bool,
    write: Callable[[str], object],
) -> list[str]:
    """Run ``techniques`` (``None``: all) and ``write`` the outcome; return the failures.

    Writes a header line and the fixed-width table, or (``as_json``) one JSON list of
    the results and nothing else. Returns, for the table only, the techniques that must
    be safe (the library's strategies, the correct lock tables) but did not end ``ok``
    — empty when every one of them that ran was ``ok``.
    """
    if not as_json:
        write(
            f"race lab on {connections[lab.using].display_name} (database {lab.using!r}): "
            f"{lab.processes} processes, {lab.rows} rows, batch {lab.batch}"
        )
    results = lab.run(techniques)
    if as_json:
        write(json.dumps([r.as_dict() for r in results], indent=2))
        return []
    write(format_table(results))
    unsafe = [r.technique for r in results if r.kind != "broken" and r.verdict != "ok"]
    if unsafe and not all(r.skipped for r in results if r.technique in unsafe):
        return unsafe
    return []
