"""The LISTEN thread: PostgreSQL wake-ups for the claimer, on a dedicated connection.

:class:`Listener` LISTENs on ``TASKCLAIM_NOTIFY_CHANNEL`` (the channel
:func:`~django_taskclaim.wakeup.notify.notify` and the table triggers of
:mod:`~django_taskclaim.wakeup.trigger` send on) over its own psycopg connection, outside
Django's, and calls ``on_wake(label)`` for each notification of a model it serves. A
pause or resume notification (:data:`~django_taskclaim.claim.paused.NOTICE_PREFIX`) first
drops the process's snapshot of the paused queues.
Notifications are only a hint: workers also poll (with jitter), so a lost notification
delays a task by at most one poll interval and never loses it.

A :class:`~django_taskclaim.worker.service.Service`: its outage loop is the one every
worker thread shares, and an outage is often noticed here first (this thread waits on
the socket), so a lost connection or a reconnect is reported to the whole process
(:mod:`~django_taskclaim.worker.dbconn`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.claim.paused import invalidate, notice_label
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.worker.dbconn import back, trouble
from django_taskclaim.worker.service import Service, logger

#: The connection parameters of Django's settings that are passed on to psycopg.
_SAFE_PARAMS = (
    "dbname",
    "user",
    "password",
    "host",
    "port",
    "service",
    "passfile",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "connect_timeout",
    "options",
    "target_session_attrs",
    "application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
)

#: Seconds between two pings of an idle LISTEN connection (a half-open one is found).
PING_EVERY = 30.0


def _channel() -> str:
    return str(taskclaim_settings.NOTIFY_CHANNEL)


class Listener(Service):
    """A thread that LISTENs on a dedicated psycopg connection and calls ``on_wake(label)``.

    Reconnects with the worker's backoff when the connection drops, and at once when
    another thread of the process reaches the database again; it calls
    ``on_wake(None)`` after reconnecting, since notifications may have been missed.
    ``online`` tells whether it currently listens. Blocks in ``select()`` while idle;
    :meth:`stop` ends it within about a second.
    """

    def __init__(
        self,
        using: str,
        labels: Iterable[str],
        on_wake: Callable[[str | None], None],
        *,
        worker_id: str = "",
        name: str = "taskclaim-listen",
    ) -> None:
        super().__init__(name, worker_id=worker_id, using=using)
        self.labels = frozenset(labels)
        self.on_wake = on_wake
        self.online = threading.Event()
        self._conn: Any = None

    def _connect(self) -> Any:
        import psycopg  # here: psycopg is needed on PostgreSQL only, not a dependency

        params = connections[self.using].get_connection_params()
        kwargs = {k: v for k, v in params.items() if k in _SAFE_PARAMS}
        kwargs.setdefault("application_name", "taskclaim-listener")
        conn = psycopg.connect(autocommit=True, **kwargs)
        django_conn = connections[self.using]
        conn.execute(for_connection(django_conn).listen_sql(django_conn.ops.quote_name(_channel())))
        return conn

    def loop(self) -> None:
        while not self.stopped:
            try:
                self._conn = self._connect()
            except Exception as exc:
                trouble(self.using)
                delay = self.failed(
                    exc,
                    "listen connection failed error=%s retry_in=%.1fs",
                    traceback=False,
                    show_delay=True,
                )
                self.wait_to_retry(delay)  # or another thread reconnected
                continue
            back(self.using)  # wakes the other threads' backoffs
            if self.outage.ok():
                logger.info("listening again channel=%s", _channel())
                self.on_wake(None)
            else:
                logger.debug("listening channel=%s database=%s", _channel(), self.using)
            self.online.set()
            try:
                self._listen()
            except Exception as exc:
                if not self.stopped:
                    trouble(self.using)
                    self.failed(
                        exc, "listen connection lost error=%s", always_warn=True, traceback=False
                    )
            finally:
                self.online.clear()
                try:
                    self._conn.close()
                except Exception:  # pragma: no cover - already broken
                    pass
                self._conn = None
            if self.outage.failures and not self.stopped:
                self.wait_to_retry(self.retry_delay())

    def close_connections(self) -> None:
        """Nothing: the LISTEN connection is closed by :meth:`loop`, and this thread
        opens none of Django's."""

    def _listen(self) -> None:
        last_check = time.monotonic()
        while not self.stopped:
            for note in self._conn.notifies(timeout=1.0):
                paused_label = notice_label(note.payload)
                if paused_label is not None:  # a pause or resume: claims re-read the pauses
                    invalidate(self.using)
                    if paused_label in self.labels:
                        self.on_wake(paused_label)
                elif not note.payload or note.payload in self.labels:
                    self.on_wake(note.payload or None)
                if self.stopped:
                    return
            if time.monotonic() - last_check > PING_EVERY:
                # Detects a half-open connection that would otherwise wait forever.
                self._conn.execute(for_alias(self.using).ping_sql)
                last_check = time.monotonic()
