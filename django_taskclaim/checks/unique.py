"""System checks of unique enqueue (``taskclaim.E030`` / ``E031``), registered on import
by :meth:`django_taskclaim.apps.TaskClaimConfig.ready`.

- E030 an :class:`~django_taskclaim.model.unique.ActiveKeyField` has no unconditional
  unique constraint: duplicate active rows would not be refused.
- E031 the field is out of step with the model: its status field or active values differ
  from ``ClaimMeta``, or its key field is missing.

The declarations they check, and ``insert_unique()``, are :mod:`django_taskclaim.model.unique`;
the other checks: :mod:`.core`, :mod:`.locks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import models

from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import CHECK_TAG
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.model.unique import ACTIVE_STATES, active_key_fields, unique_constraint_on


def check_model(model: type[models.Model]) -> list[checks.CheckMessage]:
    """The E030 / E031 findings for one model (see :func:`check_unique_keys`)."""
    errors: list[checks.CheckMessage] = []
    for field in active_key_fields(model):
        where = f"{model._meta.label}.{field.name}"
        if unique_constraint_on(model, field.name) is None:
            errors.append(
                checks.Error(
                    f"{where} is an ActiveKeyField without a unique constraint: duplicate "
                    "active rows would not be refused.",
                    hint=f"Add models.UniqueConstraint(fields=[{field.name!r}], name=...) to "
                    f"{model.__name__}.Meta.constraints (no condition), then makemigrations.",
                    obj=model,
                    id="taskclaim.E030",
                )
            )
        try:
            opts = get_options(model)
        except ConfigurationError:
            continue  # taskclaim.E002 reports it
        expected = [opts.value(s) for s in ACTIVE_STATES]
        problems = []
        if field.status_field != opts.status_field:
            problems.append(
                f"it reads status field {field.status_field!r}, the model's is "
                f"{opts.status_field!r}"
            )
        elif list(field.active_values) != expected:
            problems.append(
                f"it treats {field.active_values!r} as active, the model's ready and "
                f"processing values are {expected!r}"
            )
        names = {f.name for f in model._meta.concrete_fields}
        if field.key_field not in names:
            problems.append(f"the model has no field {field.key_field!r}")
        for problem in problems:
            errors.append(
                checks.Error(
                    f"{where} does not match the model: {problem}.",
                    hint="Let ActiveKeyField read ClaimMeta (drop status_field= / "
                    "active_values=) or fix them, then makemigrations.",
                    obj=model,
                    id="taskclaim.E031",
                )
            )
    return errors


def _models(app_configs: Iterable[Any] | None) -> Iterable[type[models.Model]]:
    if app_configs is None:
        return apps.get_models()
    return (m for config in app_configs for m in config.get_models())


@checks.register(CHECK_TAG)
def check_unique_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E030: an :class:`ActiveKeyField` has no unconditional unique constraint; E031: its
    status field or active values differ from the model's claim options, or its key field
    is missing. Registered when :mod:`django_taskclaim.apps` imports this module (``ready()``)."""
    errors: list[checks.CheckMessage] = []
    for model in _models(app_configs):
        if not model._meta.abstract and not model._meta.proxy:
            errors.extend(check_model(model))
    return errors
