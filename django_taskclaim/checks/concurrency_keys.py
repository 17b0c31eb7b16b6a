"""System checks of concurrency keys: ``taskclaim.E032`` (no unique constraint enforces a
model's ``ClaimMeta.concurrency_key``) and ``taskclaim.E033`` (its constraint is partial on
a database that ignores partial constraints).

The rule they check is :func:`django_taskclaim.claim.guard.guard_of`, the one the
claims use; registered with the other checks when the app is ready (``checks/__init__.py``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import router

from django_taskclaim.backends import for_engine
from django_taskclaim.claim.guard import guard_of
from django_taskclaim.config.discovery import checked_models
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.config.settings import CHECK_TAG
from django_taskclaim.exceptions import TaskClaimError


def _hint(opts: ClaimOptions) -> str:
    conc = opts.concurrency
    assert conc is not None
    slot = conc.limit > 1
    lines = []
    if slot and conc.slot is None:
        lines.append("add `concurrency_slot = concurrency_slot()`")
    lines.append(
        f'PostgreSQL / SQLite: add `concurrency_constraint("{conc.key}"'
        f"{', slot=True' if slot else ''})` to Meta.constraints"
    )
    lines.append(
        f'MariaDB / MySQL: add `{conc.key}_held = processing_key("{conc.key}", <field of '
        f'its type>)` and `concurrency_constraint("{conc.key}_held", generated=True'
        f"{', slot=True' if slot else ''})`"
    )
    return (
        "; ".join(lines) + " (from django_taskclaim.model.concurrency_keys), then makemigrations."
    )


@checks.register(checks.Tags.models, CHECK_TAG)
def check_concurrency_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``taskclaim.E032``: a model with ``ClaimMeta.concurrency_key`` has no unique
    constraint enforcing it; ``taskclaim.E033``: its constraint is partial and its
    database ignores partial constraints (MariaDB / MySQL)."""
    errors: list[checks.CheckMessage] = []
    for model in checked_models(app_configs):
        try:
            opts = get_options(model)
        except TaskClaimError:
            continue  # reported by taskclaim.E002
        if opts.concurrency is None:
            continue
        guard = guard_of(model)
        if guard is None:
            errors.append(
                checks.Error(
                    f"{opts.label} declares concurrency_key {opts.concurrency.key!r} "
                    f"(limit {opts.concurrency.limit}) but no unique constraint enforces it.",
                    hint=_hint(opts),
                    obj=model,
                    id="taskclaim.E032",
                )
            )
            continue
        if guard.partial:
            backend = for_engine(settings.DATABASES.get(router.db_for_write(model), {}))
            if backend is not None and not backend.partial_unique_constraints:
                errors.append(
                    checks.Error(
                        f"{opts.label}: the constraint {guard.name!r} is partial and its "
                        f"database ignores partial constraints ({backend.vendor}).",
                        hint=_hint(opts),
                        obj=model,
                        id="taskclaim.E033",
                    )
                )
    return errors
