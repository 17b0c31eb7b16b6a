"""Reading a model's ``ClaimMeta``: the static part of its claim options.

The fields a claimable model has (:data:`REQUIRED_FIELDS`, :data:`OPTIONAL_FIELDS`,
:data:`CLAIM_STATE_FIELDS`, :data:`SLOT_FIELD`), the options a ``ClaimMeta`` may set,
and what :func:`_build_static` validates once per model: its fields, statuses, ordering,
handler and per-key concurrency (:class:`Concurrency`). The options that fall back to a
``TASKCLAIM_*`` setting are read by :class:`~django_taskclaim.config.options.ClaimOptions`;
the public names here are importable from :mod:`django_taskclaim.config.options` as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.apps import apps
from django.db import models

from django_taskclaim.config import bounds
from django_taskclaim.config.rate_limits import RateLimit, rate_limits_of
from django_taskclaim.exceptions import ConfigurationError, NotClaimableError
from django_taskclaim.row.status import STATE_NAMES, Status

REQUIRED_FIELDS = ("version", "locked_until", "attempts")
#: Fields only the library's fenced operations write; a plain ``save()`` of an existing
#: row leaves them alone so that editing a row's data never un-claims it.
CLAIM_STATE_FIELDS = frozenset(
    {
        "version",
        "locked_until",
        "locked_by",
        "attempts",
        "claimed_at",
        "finished_at",
        "last_error",
    }
)
OPTIONAL_FIELDS = (
    "locked_by",
    "run_after",
    "priority",
    "created_at",
    "claimed_at",  # when the current or last attempt was claimed (database clock)
    "finished_at",
    "last_error",
    "task_timeout",  # a row's own deadline (seconds or a timedelta); None: ClaimMeta.timeout
)

# Options a ClaimMeta may set; the ones with a settings fallback map to its name.
_LIVE = {
    "lease": "LEASE",
    "max_attempts": "MAX_ATTEMPTS",
    "retry_backoff": "RETRY_BACKOFF",
    "retry_backoff_max": "RETRY_BACKOFF_MAX",
    "retry_jitter": "RETRY_JITTER",
    "strategy": "STRATEGY",
    "notify": "NOTIFY",
    "claim_gate": "CLAIM_GATE",
    "timeout": "TIMEOUT",
}
_STATIC = (
    "ordering",
    "handler",
    "status_field",
    "statuses",
    "atomic",
    "concurrency_key",
    "concurrency_limit",
    "archive",
    "rate_limit",
    "rate_limit_per",
    "key_rate_limit",
    "dependents",
)
#: The field a model with ``concurrency_limit > 1`` keeps its slot number in.
SLOT_FIELD = "concurrency_slot"
#: Every name ``ClaimMeta.strategy`` / ``TASKCLAIM_STRATEGY`` / ``claim(strategy=…)``
#: accepts: ``auto`` (picked per vendor by ``claim.resolve``) and each strategy's own
#: (``claim.STRATEGIES``; ``tests/claim/test_claim.py`` checks the two agree).
STRATEGY_NAMES: tuple[str, ...] = ("auto", "skip_locked", "cas", "advisory", "serializable", "hold")
_ALLOWED = set(_LIVE) | set(_STATIC)


@dataclass(frozen=True)
class _Static:
    model: type[models.Model]
    status_field: str
    status_column: str
    statuses: dict[str, Any]
    fields: frozenset[str]
    ordering: tuple[str, ...]
    handler: Any
    meta: Any
    concurrency: Concurrency | None
    rate_limits: tuple[RateLimit, ...] = ()


@dataclass(frozen=True)
class Concurrency:
    """A model's per-key concurrency (``ClaimMeta.concurrency_key`` / ``concurrency_limit``):
    at most ``limit`` rows ``processing`` per value of the field ``key`` (column
    ``column``); ``slot`` is the slot field's column, ``None`` when the model has none."""

    key: str
    column: str
    limit: int
    slot: str | None


def _concurrency(model: type[models.Model], meta: Any, names: set[str]) -> Concurrency | None:
    key = getattr(meta, "concurrency_key", None)
    has_limit = meta is not None and hasattr(meta, "concurrency_limit")
    if key is None:
        if has_limit:
            raise ConfigurationError(
                f"{_label(model)}.ClaimMeta.concurrency_limit needs a concurrency_key"
            )
        return None
    if not isinstance(key, str) or key not in names:
        raise ConfigurationError(
            f"{_label(model)}.ClaimMeta.concurrency_key must name a concrete field, got {key!r}"
        )
    field = cast(models.Field, model._meta.get_field(key))
    if field.primary_key or key in REQUIRED_FIELDS + OPTIONAL_FIELDS or key == SLOT_FIELD:
        raise ConfigurationError(
            f"{_label(model)}.ClaimMeta.concurrency_key cannot be the claim field {key!r}"
        )
    if getattr(field, "generated", False):
        raise ConfigurationError(
            f"{_label(model)}.ClaimMeta.concurrency_key must be a stored field, "
            f"not the generated field {key!r}"
        )
    limit = int(
        bounds.number(
            getattr(meta, "concurrency_limit", 1),
            f"{_label(model)} ClaimMeta.concurrency_limit",
            bounds.CONCURRENCY_LIMIT,
        )
    )
    slot = None
    if SLOT_FIELD in names:
        slot = str(model._meta.get_field(SLOT_FIELD).column)  # type: ignore[union-attr]
    return Concurrency(key=key, column=str(field.column), limit=limit, slot=slot)


def _label(model: type[models.Model]) -> str:
    return model._meta.label


def _build_static(model: type[models.Model]) -> _Static:
    meta = getattr(model, "ClaimMeta", None)
    if meta is not None:
        unknown = sorted(k for k in vars(meta) if not k.startswith("_") and k not in _ALLOWED)
        if unknown:
            raise ConfigurationError(
                f"{_label(model)}.ClaimMeta has unknown option(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(_ALLOWED))}"
            )
    names = {f.name for f in model._meta.concrete_fields}
    missing = [f for f in REQUIRED_FIELDS if f not in names]
    status_field = getattr(meta, "status_field", "status")
    if status_field not in names:
        missing.append(status_field)
    if missing:
        raise NotClaimableError(
            f"{_label(model)} is not claimable: it has no field(s) {', '.join(missing)}. "
            "Inherit django_taskclaim.models.ClaimableModel (or the finer mixins) and run "
            "makemigrations."
        )
    present = frozenset(f for f in REQUIRED_FIELDS + OPTIONAL_FIELDS if f in names)
    statuses = dict(getattr(meta, "statuses", None) or {s: Status(s).value for s in STATE_NAMES})
    for state in ("ready", "processing", "done", "failed"):
        if state not in statuses or statuses[state] is None:
            raise ConfigurationError(
                f"{_label(model)}.ClaimMeta.statuses must map {state!r} to a stored value"
            )
    unknown_states = set(statuses) - set(STATE_NAMES)
    if unknown_states:
        raise ConfigurationError(
            f"{_label(model)}.ClaimMeta.statuses has unknown state(s) "
            f"{', '.join(sorted(unknown_states))}; states are {', '.join(STATE_NAMES)}"
        )
    values = [v for v in statuses.values() if v is not None]
    if len(set(values)) != len(values):
        raise ConfigurationError(f"{_label(model)}.ClaimMeta.statuses maps two states to one value")
    ordering = getattr(meta, "ordering", None)
    if ordering is None:
        # No "pk" tie-break by default: the claim index is (priority DESC, created_at),
        # and an ORDER BY it does not cover makes every claim sort all the rows enqueued
        # in one transaction (they share created_at). Ties come in index order, which is
        # insertion order (PostgreSQL: heap order; InnoDB and SQLite append the pk).
        defaults = (("-priority", "priority"), ("created_at", "created_at"))
        ordering = tuple(o for o, f in defaults if f in present) or ("pk",)
    else:
        ordering = tuple(ordering)
        for item in ordering:
            name = item.lstrip("-")
            if name != "pk" and name not in names:
                raise ConfigurationError(
                    f"{_label(model)}.ClaimMeta.ordering names unknown field {name!r}"
                )
    concurrency = _concurrency(model, meta, names)
    return _Static(
        model=model,
        status_field=status_field,
        status_column=str(model._meta.get_field(status_field).column),  # type: ignore[union-attr]
        statuses=statuses,
        fields=present,
        ordering=ordering,
        handler=getattr(meta, "handler", "process"),
        meta=meta,
        concurrency=concurrency,
        rate_limits=rate_limits_of(
            _label(model), meta, names, concurrency.key if concurrency else None
        ),
    )


def _archive_label(model: type[models.Model]) -> str | None:
    value = getattr(getattr(model, "ClaimMeta", None), "archive", None)
    if isinstance(value, str):
        return value.lower()
    if isinstance(value, type) and issubclass(value, models.Model):
        return value._meta.label_lower
    return None


def is_archive(model: type[models.Model]) -> bool:
    """Whether ``model`` keeps another model's finished rows: built by
    :func:`~django_taskclaim.recovery.archive.archive_of`, or named in some installed model's
    ``ClaimMeta.archive``. Its rows are history: it is never claimed, though it has the
    claim fields."""
    if getattr(model, "taskclaim_archive_of", None):
        return True
    if not apps.ready:
        return False
    label = model._meta.label_lower
    return any(_archive_label(m) == label for m in apps.get_models() if m is not model)
