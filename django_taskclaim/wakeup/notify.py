"""PostgreSQL ``LISTEN/NOTIFY`` wake-ups: workers start ready rows without waiting to poll.

Senders: a ``post_save`` hook notifies when a row of a claimable model is saved in the
``ready`` state (connected by :func:`connect_signals` from the app's ``ready()``), and
:func:`notify` is the call to make after ``bulk_create()``, ``update()`` or raw inserts,
which send no ``post_save``. A notification is sent when the saving transaction commits
(never before: a worker woken earlier would not see the row), once per model and
transaction. The payload is the model label (``app_label.ModelName``) on the channel
``TASKCLAIM_NOTIFY_CHANNEL``.

Receiver: :class:`Listener`, a thread of the worker on its own dedicated psycopg
connection. Notifications are only a hint: workers also poll (with jitter), so a lost
notification delays a task by at most one poll interval and never loses it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections, models, router, transaction
from django.db.models.signals import post_save

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.config.options import get_options, is_claimable
from django_taskclaim.config.settings import taskclaim_settings

logger = logging.getLogger("django_taskclaim.wakeup.notify")

_DISPATCH_UID = "django_taskclaim.wakeup.notify.on_save"
_claimable_cache: dict[type, bool] = {}


def _channel() -> str:
    return str(taskclaim_settings.NOTIFY_CHANNEL)


def _mode(model: type[models.Model]) -> bool | str:
    """The model's ``notify`` option (``False`` for a model that is not claimable)."""
    cached = _claimable_cache.get(model)
    if cached is None:
        cached = _claimable_cache[model] = bool(not model._meta.abstract and is_claimable(model))
    if not cached:
        return False
    return get_options(model).notify


def notify(model: type[models.Model], using: str | None = None) -> bool:
    """Wake the workers listening for ``model`` once the current transaction commits.

    Call it after ``bulk_create()``, ``QuerySet.update()`` or raw SQL that made rows of
    ``model`` ready: those send no ``post_save``. Outside a transaction the
    notification goes out at once. Returns whether a notification was (or will be)
    sent: only on PostgreSQL, and only if the model's ``notify`` option
    (``ClaimMeta.notify`` / ``TASKCLAIM_NOTIFY``) is on. Repeated calls inside one
    transaction send one notification. With ``notify = "trigger"`` the table's trigger
    has sent it already: nothing more is sent, and the answer is ``True``.
    """
    if model._meta.proxy:
        model = model._meta.concrete_model  # type: ignore[assignment]
    using = using or router.db_for_write(model)
    conn = connections[using]
    mode = _mode(model)
    if not for_connection(conn).supports_notify or not mode:
        return False
    if mode == "trigger":
        return True
    label = model._meta.label
    # One callback per model and transaction: look for ours among the pending ones.
    for entry in conn.run_on_commit:
        if getattr(entry[1], "taskclaim_label", None) == label:
            return True

    def send() -> None:
        try:
            statement = for_alias(using).notify(_channel(), label)
            with connections[using].cursor() as cursor:
                cursor.execute(statement.sql, statement.params)
        except Exception as exc:  # a lost hint only delays the task until the next poll
            logger.warning("notify failed model=%s database=%s error=%s", label, using, exc)

    send.taskclaim_label = label  # type: ignore[attr-defined]
    transaction.on_commit(send, using=using)
    return True


def _on_save(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    if kwargs.get("raw") or _mode(sender) is not True:  # "trigger": the table sends it
        return
    opts = get_options(sender)
    if getattr(instance, opts.status_field) != opts.value("ready"):
        return
    notify(sender, using=kwargs.get("using"))


def connect_signals() -> None:
    """Connect the ``post_save`` hook that notifies workers of rows saved ``ready``.

    Idempotent; called from the app's ``ready()``.
    """
    post_save.connect(_on_save, dispatch_uid=_DISPATCH_UID, weak=False)


def disconnect_signals() -> None:
    """Undo :func:`connect_signals` (for projects that only want explicit notifies)."""
    post_save.disconnect(dispatch_uid=_DISPATCH_UID)


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


class Listener(threading.Thread):
    """A thread that LISTENs on a dedicated psycopg connection and calls ``on_wake(label)``.

    Reconnects with the worker's backoff when the connection drops, and at once when
    another thread of the process reaches the database again; it calls
    ``on_wake(None)`` after reconnecting, since notifications may have been missed.
    A lost connection or a reconnect is reported to the rest of the process (an outage
    is noticed here first: this thread waits on the socket). ``online`` tells whether
    it currently listens. Blocks in ``select()`` while idle.
    """

    def __init__(
        self,
        using: str,
        labels: Iterable[str],
        on_wake: Callable[[str | None], None],
        *,
        name: str = "taskclaim-listen",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.using = using
        self.labels = frozenset(labels)
        self.on_wake = on_wake
        self.online = threading.Event()
        self._halt = threading.Event()
        self._retry = threading.Event()  # ends a backoff early
        self._conn: Any = None

    def stop(self) -> None:
        """Ask the thread to end (within about a second)."""
        self._halt.set()
        self._retry.set()

    def _connect(self) -> Any:
        import psycopg  # here: psycopg is needed on PostgreSQL only, not a dependency

        params = connections[self.using].get_connection_params()
        kwargs = {k: v for k, v in params.items() if k in _SAFE_PARAMS}
        kwargs.setdefault("application_name", "taskclaim-listener")
        conn = psycopg.connect(autocommit=True, **kwargs)
        django_conn = connections[self.using]
        conn.execute(for_connection(django_conn).listen_sql(django_conn.ops.quote_name(_channel())))
        return conn

    def run(self) -> None:
        # Deferred: the worker package, which starts this thread, imports this module.
        from django_taskclaim.worker.dbconn import back, backoff, pause, trouble

        failures = 0
        while not self._halt.is_set():
            try:
                self._conn = self._connect()
            except Exception as exc:
                failures += 1
                trouble(self.using)
                delay = backoff(failures, self.using)
                log = logger.warning if failures == 1 else logger.debug
                log("listen connection failed error=%s retry_in=%.1fs", _one_line(exc), delay)
                pause(delay, self._retry, self.using)  # or another thread reconnected
                continue
            back(self.using)  # wakes the other threads' backoffs
            if failures:
                logger.info("listening again channel=%s", _channel())
                self.on_wake(None)
            else:
                logger.debug("listening channel=%s database=%s", _channel(), self.using)
            failures = 0
            self.online.set()
            try:
                self._listen()
            except Exception as exc:
                if not self._halt.is_set():
                    logger.warning("listen connection lost error=%s", _one_line(exc))
                    failures = 1
                    trouble(self.using)
            finally:
                self.online.clear()
                try:
                    self._conn.close()
                except Exception:  # pragma: no cover - already broken
                    pass
                self._conn = None
            if failures and not self._halt.is_set():
                self._halt.wait(random.uniform(0.2, 1.0))

    def _listen(self) -> None:
        last_check = time.monotonic()
        while not self._halt.is_set():
            for note in self._conn.notifies(timeout=1.0):
                if not note.payload or note.payload in self.labels:
                    self.on_wake(note.payload or None)
                if self._halt.is_set():
                    return
            if time.monotonic() - last_check > 30:
                # Detects a half-open connection that would otherwise wait forever.
                self._conn.execute(for_alias(self.using).ping_sql)
                last_check = time.monotonic()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
