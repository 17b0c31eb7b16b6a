"""The event loop async task bodies run on: one per worker process, on its own thread.

An executor thread that takes a row with an ``async def`` body hands the coroutine to
the loop and waits for it, so async bodies share the executors' slots: at most
``--concurrency`` bodies run at once, sync and async together, each with the lease,
heartbeat, fencing, retry and ``BaseException`` rules of any body (the executor records
the outcome exactly as for a sync body). While they wait on I/O the loop runs the others.

Cancellation raises ``asyncio.CancelledError`` into the body at its current ``await``:
when the heartbeat finds the claim taken back, and when the grace period of a graceful
stop runs out. A body that catches it and goes on is left running (its writes are
fenced out; at the end of a grace period it is requeued like a sync body).

Django's ORM from an async body (``await Model.objects.acreate(…)``,
``sync_to_async``) runs on asgiref's one thread for sync code, one call at a time,
on that thread's own database connection, which is kept open between bodies.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from django_taskclaim.settle.outcome import cancel_flag
from django_taskclaim.worker.dbconn import connection_trouble

logger = logging.getLogger("django_taskclaim.worker")


class _Run:
    """One body on the loop: its asyncio task once started, and whether it is cancelled."""

    __slots__ = ("atask", "cancelled")

    def __init__(self) -> None:
        self.atask: asyncio.Task[Any] | None = None
        self.cancelled = False


class _Result:
    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error


class EventLoop:
    """The process's event loop, started on the first async body; thread-safe."""

    def __init__(self, *, worker_id: str) -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runs: dict[int, tuple[Any, _Run]] = {}  # id(row) -> (row, run)

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._serve, args=(loop,), name="taskclaim-async", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            if not asyncio.all_tasks(loop):  # a body that ignored cancellation keeps it
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

    def run(self, func: Callable[..., Any], task: Any, kwargs: dict[str, Any]) -> Any:
        """Run ``await func(task, **kwargs)`` on the loop and wait for it (called from an
        executor thread); return its result or raise what it raised."""
        loop = self._get_loop()
        run = _Run()
        with self._lock:
            self._runs[id(task)] = (task, run)
        # Registered first, then the flag read: a claim lost from now on cancels the run
        # through cancel(); one lost before is seen here.
        if cancel_flag(task).is_set():
            run.cancelled = True
        try:
            future = asyncio.run_coroutine_threadsafe(self._guard(func, task, kwargs, run), loop)
            try:
                result = future.result()
            except concurrent.futures.CancelledError:
                # Cancelled as the body returned: its result is not used.
                raise asyncio.CancelledError() from None
        finally:
            with self._lock:
                self._runs.pop(id(task), None)
        if result.error is not None:
            raise result.error
        return result.value

    async def _guard(
        self, func: Callable[..., Any], task: Any, kwargs: dict[str, Any], run: _Run
    ) -> _Result:
        run.atask = asyncio.current_task()
        if run.cancelled:  # taken back before it started: never started
            return _Result(error=asyncio.CancelledError())
        try:
            return _Result(value=await func(task, **kwargs))
        except BaseException as exc:  # CancelledError included: the executor records it
            if connection_trouble(exc):
                # The next body gets a fresh connection on asgiref's sync thread.
                await sync_to_async(connections.close_all)()
            return _Result(error=exc)

    def cancel(self, task: Any) -> bool:
        """Raise ``CancelledError`` into the body of ``task`` if it runs on the loop;
        return whether it does."""
        with self._lock:
            entry = self._runs.get(id(task))
            loop = self._loop
        if entry is None or loop is None:
            return False
        run = entry[1]
        run.cancelled = True
        atask = run.atask
        if atask is not None:
            loop.call_soon_threadsafe(atask.cancel)
        return True

    def cancel_all(self) -> list[Any]:
        """Cancel every body on the loop; return their rows."""
        with self._lock:
            tasks = [task for task, _run in self._runs.values()]
        return [task for task in tasks if self.cancel(task)]

    def busy(self) -> int:
        """Bodies running on the loop now."""
        with self._lock:
            return len(self._runs)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop once no body runs on it (one still running keeps it: the
        process is exiting anyway)."""
        with self._lock:
            loop, thread, busy = self._loop, self._thread, bool(self._runs)
        if loop is None or thread is None or busy:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
