"""Which models are claimable: the one discovery of "every claimable model" (the
dashboard, the commands, a worker started without labels, the checks, the doctor), and the
lookup of a model named on a command line.

An app keeps its models out of the discovery with ``taskclaim_discover = False`` on its
``AppConfig`` (they stay claimable where named). Above :mod:`.options` (a named model's
options are validated on lookup) and :mod:`.claim_meta` (archives are never claimable).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.apps import apps
from django.db import models

from django_taskclaim.config.claim_meta import REQUIRED_FIELDS, is_archive
from django_taskclaim.config.options import get_options
from django_taskclaim.exceptions import ConfigurationError

__all__ = ["checked_models", "claimable_models", "is_claimable", "resolve_model"]


def is_claimable(model: type[models.Model]) -> bool:
    """Whether ``model`` has the fields needed to be claimed (and is not an archive:
    :func:`is_archive`)."""
    names = {f.name for f in model._meta.concrete_fields}
    status = getattr(getattr(model, "ClaimMeta", None), "status_field", "status")
    has_fields = all(f in names for f in REQUIRED_FIELDS) and status in names
    return has_fields and not is_archive(model)


def claimable_models() -> Iterator[type[models.Model]]:
    """Every installed, concrete, non-proxy model that can be claimed, except those of
    an app whose config sets ``taskclaim_discover = False`` (claimed only where named)."""
    for model in apps.get_models():
        if not getattr(model._meta.app_config, "taskclaim_discover", True):
            continue
        if not model._meta.abstract and not model._meta.proxy and is_claimable(model):
            yield model


def checked_models(app_configs: Any = None) -> Iterator[type[models.Model]]:
    """The claimable models a system check looks at: every one (``app_configs`` is
    ``None``), or those of the given app configs (``manage.py check <app>``)."""
    for model in claimable_models():
        if app_configs is None or model._meta.app_config in app_configs:
            yield model


def resolve_model(label: str) -> type[models.Model]:
    """Return the claimable model named ``app_label.ModelName`` or raise a clear error."""
    if not isinstance(label, str) or label.count(".") != 1:
        raise ConfigurationError(f"{label!r} is not a model label; use app_label.ModelName")
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError):
        known = ", ".join(m._meta.label for m in claimable_models()) or "none installed"
        raise ConfigurationError(
            f"no model {label!r} is installed; claimable models: {known}"
        ) from None
    get_options(model)
    return model
