"""PgQueuer workers for ``benchmarks/peers.py``: factories plus a command line to run one.

    python -m benchmarks.peer_pgqueuer noop --batch-size 100 --drain
    python -m benchmarks.peer_pgqueuer stamp --batch-size 1

The command line does what ``pgq run benchmarks.peer_pgqueuer:noop --batch-size 100
--mode drain`` does — ``pgqueuer.run()`` (PgQueuer's supervisor, the same code path as
its CLI), on uvloop where it is installed, with PgQueuer's own log set-up — because
``pgq run`` of PgQueuer 1.6.0 cannot start beside typer 0.29 (its ``--log-level``
option reaches ``setup_fancy_logger`` as a string: ``AttributeError: 'str' object has
no attribute 'name'``).

Each factory opens one connection to ``TASKCLAIM_PEERS_PGQ_DSN`` (a URI) with the driver
named by ``TASKCLAIM_PEERS_PGQ_DRIVER`` — ``asyncpg`` (PgQueuer's first choice, the default)
or ``psycopg`` (async, autocommit, as PgQueuer's psycopg driver requires) — and yields a
``QueueManager`` with one entrypoint:

* ``noop`` — does nothing (the throughput runs);
* ``stamp`` — appends ``<job id> <time.time()>`` to the file named by
  ``TASKCLAIM_PEERS_PGQ_STAMPS`` when the job starts (the enqueue→start runs).

No per-entrypoint concurrency limit and no ``--max-concurrent-tasks``: PgQueuer then
claims ``--batch-size`` jobs per dequeue and runs them as asyncio tasks of its process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta

import pgqueuer
import psycopg
from pgqueuer.core import logconfig
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

DSN_ENV = "TASKCLAIM_PEERS_PGQ_DSN"
STAMPS_ENV = "TASKCLAIM_PEERS_PGQ_STAMPS"
DRIVER_ENV = "TASKCLAIM_PEERS_PGQ_DRIVER"
DRIVERS = ("asyncpg", "psycopg")


@asynccontextmanager
async def _manager() -> AsyncIterator[QueueManager]:
    dsn = os.environ[DSN_ENV]
    driver = os.environ.get(DRIVER_ENV, "asyncpg")
    if driver == "psycopg":
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
            yield QueueManager(Queries.from_psycopg_connection(connection))
        return
    if driver != "asyncpg":
        raise ValueError(f"{DRIVER_ENV} must be one of {', '.join(DRIVERS)}, not {driver!r}")
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        yield QueueManager(Queries.from_asyncpg_connection(connection))
    finally:
        await connection.close()


@asynccontextmanager
async def noop() -> AsyncIterator[QueueManager]:
    """A queue manager whose ``noop`` entrypoint does nothing."""
    async with _manager() as qm:

        @qm.entrypoint("noop")
        async def run_noop(job: Job) -> None:
            return None

        yield qm


@asynccontextmanager
async def stamp() -> AsyncIterator[QueueManager]:
    """A queue manager whose ``stamp`` entrypoint records when each job started."""
    path = os.environ[STAMPS_ENV]
    async with _manager() as qm:
        with open(path, "a", buffering=1) as out:

            @qm.entrypoint("stamp")
            async def run_stamp(job: Job) -> None:
                out.write(f"{job.id} {time.time()!r}\n")

            yield qm


FACTORIES: dict[str, Callable[[], AbstractAsyncContextManager[QueueManager]]] = {
    "noop": noop,
    "stamp": stamp,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one PgQueuer worker process.")
    p.add_argument("factory", choices=sorted(FACTORIES))
    p.add_argument("--batch-size", type=int, default=10, help="jobs per dequeue (as pgq run)")
    p.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    p.add_argument("--dequeue-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    logconfig.setup_fancy_logger(logconfig.LogLevel.WARNING)
    worker = pgqueuer.run(
        FACTORIES[args.factory],
        batch_size=args.batch_size,
        dequeue_timeout=timedelta(seconds=args.dequeue_timeout),
        mode=QueueExecutionMode.drain if args.drain else QueueExecutionMode.continuous,
    )
    try:
        import uvloop
    except ImportError:
        asyncio.run(worker)
    else:
        uvloop.run(worker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
