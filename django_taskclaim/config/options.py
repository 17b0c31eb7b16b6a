"""Per-model claim options: the one place where a model says how it is claimed.

A claimable model may declare a nested ``ClaimMeta`` class::

    class Document(ClaimableModel):
        class ClaimMeta:
            lease = 60                 # seconds (or a timedelta)
            max_attempts = 3
            strategy = "skip_locked"
            ordering = ("-priority", "created_at", "pk")
            handler = "process"        # method name, dotted path or callable
            concurrency_key = "customer_id"  # at most concurrency_limit processing per value
            concurrency_limit = 1
            timeout = 600              # seconds a body may run (None: no deadline)

Anything not declared falls back to the ``TASKCLAIM_*`` setting of the same name, read
at call time. :func:`get_options` resolves and validates them. The static part (the
claim fields, statuses, ordering, per-key concurrency) is read and validated in
:mod:`django_taskclaim.config.claim_meta` (import its names from there).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cached_property
from typing import Any, cast

from django.apps import apps
from django.core.signals import setting_changed
from django.db import models
from django.utils.module_loading import import_string

from django_taskclaim.config import bounds
from django_taskclaim.config.claim_meta import (
    _LIVE,
    STRATEGY_NAMES,
    Concurrency,
    _build_static,
    _label,
    _Static,
    is_archive,
)
from django_taskclaim.config.rate_limits import RateLimit
from django_taskclaim.config.settings import PREFIX, taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError, NotClaimableError
from django_taskclaim.row.claimable import Claimable

_cache: dict[type[models.Model], ClaimOptions] = {}


class ClaimOptions:
    """Resolved claim options of one model, built once per model by :func:`get_options`.

    Static parts (fields, statuses, ordering) are validated when it is built; each
    option that falls back to a ``TASKCLAIM_*`` setting (lease, attempts, backoff,
    strategy, notify, claim gate, atomic) is read from ``ClaimMeta`` or the setting and validated on
    first use, then kept. A change of any ``TASKCLAIM_*`` setting (``override_settings``,
    Django's ``setting_changed``) drops every model's options, so the next
    :func:`get_options` reads them again. An invalid option raises
    :class:`ConfigurationError` each time it is used, and is never kept.
    """

    def __init__(self, static: _Static) -> None:
        self._s = static

    # -- static -----------------------------------------------------------------
    @property
    def model(self) -> type[models.Model]:
        return self._s.model

    @property
    def label(self) -> str:
        return self._label

    @cached_property
    def _label(self) -> str:
        return _label(self._s.model)

    @property
    def status_field(self) -> str:
        return self._s.status_field

    @property
    def status_column(self) -> str:
        return self._s.status_column

    @property
    def statuses(self) -> dict[str, Any]:
        return self._s.statuses

    @property
    def ordering(self) -> tuple[str, ...]:
        return self._s.ordering

    @property
    def concurrency(self) -> Concurrency | None:
        """The model's per-key concurrency, or ``None`` when it declares no
        ``ClaimMeta.concurrency_key`` (claims are then unchanged)."""
        return self._s.concurrency

    @property
    def rate_limits(self) -> tuple[RateLimit, ...]:
        """The model's rate limits (``ClaimMeta.rate_limit`` / ``key_rate_limit``), or
        ``()`` when it declares none (claims are then unchanged)."""
        return self._s.rate_limits

    @cached_property
    def atomic(self) -> bool:
        """``ClaimMeta.atomic``: run the handler and write the completion in one fenced
        transaction, so the handler's database writes commit exactly when the task does."""
        value = getattr(self._s.meta, "atomic", False)
        if not isinstance(value, bool):
            raise ConfigurationError(
                f"{self.label} ClaimMeta.atomic must be True or False, got {value!r}"
            )
        return value

    @cached_property
    def archive(self) -> type[models.Model] | None:
        """``ClaimMeta.archive``: the model (``"app_label.Model"`` or the class) that
        :func:`~django_taskclaim.recovery.archive.archive_finished` moves this model's finished
        rows to, or ``None`` when it declares none (``taskclaim_prune`` then deletes)."""
        value = getattr(self._s.meta, "archive", None)
        if value is None:
            return None
        target: Any = value
        if isinstance(value, str):
            try:
                target = apps.get_model(value)
            except (LookupError, ValueError):
                raise ConfigurationError(
                    f"{self.label} ClaimMeta.archive {value!r} is not an installed model; "
                    "write it as 'app_label.ModelName'"
                ) from None
        if not (isinstance(target, type) and issubclass(target, models.Model)):
            raise ConfigurationError(
                f"{self.label} ClaimMeta.archive must be a model or 'app_label.ModelName', "
                f"got {value!r}"
            )
        if target is self.model or target._meta.db_table == self.model._meta.db_table:
            raise ConfigurationError(
                f"{self.label} ClaimMeta.archive names the model itself; "
                "it must be another table (django_taskclaim.recovery.archive.archive_of builds one)"
            )
        return target

    @cached_property
    def dependents(self) -> bool:
        """``ClaimMeta.dependents``: rows of this model may be prerequisites of other rows
        (``after=``), so each of their final settles releases its dependents in its own
        transaction (:mod:`django_taskclaim.settle.dependents`). Off by default: a model
        whose rows nobody waits for settles with no extra statement."""
        value = getattr(self._s.meta, "dependents", False)
        if not isinstance(value, bool):
            raise ConfigurationError(
                f"{self.label} ClaimMeta.dependents must be True or False, got {value!r}"
            )
        return value

    def has(self, field: str) -> bool:
        """Whether the model has the optional bookkeeping field ``field``."""
        return field in self._s.fields

    def value(self, state: str) -> Any:
        """The stored value of a logical state (``"ready"`` → ``"ready"`` or ``1``)."""
        return self._s.statuses[state]

    def state_of(self, value: Any) -> str | None:
        """The logical state name of a stored status value."""
        for name, stored in self._s.statuses.items():
            if stored == value:
                return name
        return None

    def status_q(self, *states: str) -> models.Q:
        vals = [self.value(s) for s in states if self._s.statuses.get(s) is not None]
        if len(vals) == 1:
            return models.Q(**{self.status_field: vals[0]})
        return models.Q(**{f"{self.status_field}__in": vals})

    # -- live ---------------------------------------------------------------------
    def _get(self, name: str) -> Any:
        meta = self._s.meta
        if meta is not None and hasattr(meta, name):
            return getattr(meta, name)
        return getattr(taskclaim_settings, _LIVE[name])

    @cached_property
    def lease(self) -> float:
        """Seconds a claim holds a row: finite, within :data:`~.bounds.LEASE` (at most
        30 days; heartbeats keep longer tasks alive)."""
        return float(
            bounds.number(self._get("lease"), f"{self.label} lease", bounds.LEASE, seconds=True)
        )

    @cached_property
    def max_attempts(self) -> int:
        """Claims before a task ends ``failed``: a whole number in :data:`~.bounds.MAX_ATTEMPTS`."""
        return int(
            bounds.number(
                self._get("max_attempts"), f"{self.label} max_attempts", bounds.MAX_ATTEMPTS
            )
        )

    @cached_property
    def strategy(self) -> str:
        value = self._get("strategy")
        if value not in STRATEGY_NAMES:
            raise ConfigurationError(
                f"{self.label} strategy {value!r} is unknown; "
                f"choose one of {', '.join(STRATEGY_NAMES)}"
            )
        return str(value)

    @cached_property
    def notify(self) -> bool | str:
        """How PostgreSQL wakes idle workers for this model's ready rows: ``True`` (the
        ``post_save`` hook and :func:`~django_taskclaim.wakeup.notify.notify` send ``NOTIFY``
        when the transaction commits), ``"trigger"`` (a trigger on the table does, for
        every writer: :mod:`~django_taskclaim.wakeup.trigger`) or ``False`` (workers
        only poll)."""
        value = self._get("notify")
        if value is True or value is False or value == "trigger":
            return value
        raise ConfigurationError(
            f"{self.label} notify must be True, False or 'trigger', got {value!r}"
        )

    @cached_property
    def claim_gate(self) -> int | None:
        """The smallest claim (rows) that takes its turn at the table's claim gate, or
        ``None`` (never): see :meth:`~django_taskclaim.backends.base.DatabaseSQL.claim_gate`.
        A whole number in :data:`~.bounds.CLAIM_GATE`."""
        value = self._get("claim_gate")
        if value is None:
            return None
        return int(bounds.number(value, f"{self.label} claim_gate", bounds.CLAIM_GATE))

    @cached_property
    def timeout(self) -> float | None:
        """``ClaimMeta.timeout`` (or ``TASKCLAIM_TIMEOUT``): seconds a body may run before
        it is told to stop and its attempt fails with ``TimeoutError``; ``None``: no
        deadline. A row's own ``task_timeout`` field, where the model has one and the row
        sets it, wins (see :mod:`django_taskclaim.settle.deadline`). Within
        :data:`~.bounds.TIMEOUT`."""
        value = self._get("timeout")
        if value is None:
            return None
        return float(bounds.number(value, f"{self.label} timeout", bounds.TIMEOUT, seconds=True))

    @cached_property
    def retry_jitter(self) -> float:
        """The ± fraction of random spread on retry delays, between 0 and 1."""
        return float(
            bounds.number(
                self._get("retry_jitter"), f"{self.label} retry_jitter", bounds.RETRY_JITTER
            )
        )

    @cached_property
    def _backoff(self) -> tuple[float, float, float]:
        base = bounds.number(
            self._get("retry_backoff"),
            f"{self.label} retry_backoff",
            bounds.RETRY_BACKOFF,
            seconds=True,
        )
        cap = bounds.number(
            self._get("retry_backoff_max"),
            f"{self.label} retry_backoff_max",
            bounds.RETRY_BACKOFF,
            seconds=True,
        )
        return float(base), float(cap), self.retry_jitter

    def backoff(self, attempts: int) -> float:
        """Seconds to wait before the next attempt after ``attempts`` claims.

        ``retry_backoff * 2 ** (attempts - 1)`` capped at ``retry_backoff_max``, with
        ``± retry_jitter`` random spread so that retries of a failed batch spread out.
        """
        base, cap, jitter = self._backoff
        return retry_delay(attempts, base=base, cap=cap, jitter=jitter)

    def handler(self) -> Callable[[Any], Any] | None:
        """The callable that processes one claimed row, or ``None`` if the model has none.

        ``ClaimMeta.handler`` may be a method name on the model (default ``"process"``),
        a dotted path to a function taking the row, or a callable.
        """
        h = self._s.handler
        if callable(h):
            return h
        if isinstance(h, str):
            if "." not in h:
                method = getattr(self._s.model, h, None)
                if callable(method):
                    return method
                return None
            try:
                return import_string(h)
            except ImportError as exc:
                raise ConfigurationError(
                    f"{self.label} ClaimMeta.handler {h!r} cannot be imported: {exc}"
                ) from exc
        return None


def retry_delay(attempts: int, *, base: float, cap: float, jitter: float) -> float:
    """The retry backoff rule, the one both the claim options and the tasks backend use:
    ``base * 2 ** (attempts - 1)`` seconds capped at ``cap``, then spread by
    ``± jitter`` (a fraction) so that the retries of a failed batch do not come back
    together. Never negative; ``attempts`` below 1 counts as 1."""
    delay = min(cap, base * 2.0 ** min(max(0, attempts - 1), 60))
    if jitter:
        delay *= 1 + random.uniform(-jitter, jitter)
    return max(0.0, delay)


def get_options(model: type[models.Model] | models.Model | Claimable) -> ClaimOptions:
    """Return the validated :class:`ClaimOptions` of a claimable model.

    Raises :class:`NotClaimableError` if the model lacks the claim fields or is an
    archive (:func:`is_archive`) and :class:`ConfigurationError` if its ``ClaimMeta`` is
    invalid.
    """
    seen: Any = model if isinstance(model, type) else type(model)
    found = _cache.get(seen)  # the hot path: a model seen before (no cast(): a call each)
    if found is not None:
        return found
    cls = cast(type[models.Model], seen)
    if cls._meta.proxy:
        cls = cast(type[models.Model], cls._meta.concrete_model)
    options = _cache.get(cls)
    if options is None:
        if is_archive(cls):
            raise NotClaimableError(
                f"{_label(cls)} is an archive of finished rows (ClaimMeta.archive); "
                "its rows are never claimed"
            )
        options = _cache[cls] = ClaimOptions(_build_static(cls))
    _cache[seen] = options  # a proxy finds its concrete model's options at once
    return options


def _settings_changed(setting: str, **kwargs: Any) -> None:
    if setting.startswith(PREFIX):
        _cache.clear()


setting_changed.connect(_settings_changed, dispatch_uid="django_taskclaim.config.options.settings")
