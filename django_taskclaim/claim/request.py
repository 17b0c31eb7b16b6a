"""One claim, as every strategy receives it: :class:`ClaimRequest`.

Built once per ``claim()`` call by :func:`django_taskclaim.claim.claim_rows` (after the
arguments are validated and the rows that may be claimed are decided by
:mod:`~django_taskclaim.claim.scope`), then passed whole to the strategy and the
statements it runs, instead of the same six parameters repeated in each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.db import models

    from django_taskclaim.config.options import ClaimOptions


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Claim at most ``n`` rows of ``qs`` for ``worker`` until ``now() + lease`` seconds.

    ``qs`` is already narrowed to the rows that may be claimed (``scope.claimable``);
    ``cache_key`` is set when it carries no filter of the caller's, so a strategy may
    reuse the SQL it compiled for the same key before (``scope.plain_key``).
    """

    qs: models.QuerySet[Any]
    n: int
    opts: ClaimOptions
    lease: float
    worker: str
    cache_key: tuple[Any, ...] | None = None

    @property
    def db(self) -> str:
        """The database alias of the claim."""
        return str(self.qs.db)

    @property
    def model(self) -> type[models.Model]:
        return self.qs.model
