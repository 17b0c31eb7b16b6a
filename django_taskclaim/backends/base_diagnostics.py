"""The diagnostics every vendor class has: query plans, table sizes, statistics.

:class:`DiagnosticsSQL` is the part of :class:`~django_taskclaim.backends.base.DatabaseSQL`
(which subclasses it) that the doctor asks (:mod:`django_taskclaim.ops.doctor`). The
defaults here say "cannot tell"; ``postgresql.py`` implements them. The conventions are
those of ``base.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django_taskclaim.backends.statement import Statement


class DiagnosticsSQL:
    """The diagnostic statements of one database vendor (see the module docstring)."""

    #: Django's ``connection.vendor`` this class speaks to (set by ``DatabaseSQL``).
    vendor: str

    # --------------------------------------------------------------------- diagnostics

    #: Whether :meth:`explain` exists: the plan of a SELECT can be read without running it.
    explains_plans: ClassVar[bool] = False

    def explain(self, sql: str, params: Sequence[Any] = ()) -> Statement:
        """The statement returning the plan of the SELECT ``sql`` (text and ``params`` as
        the ORM compiled them) without running it. Read its rows as mappings of column
        name to value and hand them to :meth:`plan_uses_index` / :meth:`plan_summary`."""
        raise NotImplementedError(f"{self.vendor} plans are not read here")

    def plan_uses_index(self, plan: Sequence[Mapping[str, Any]], index: str) -> bool | None:
        """Whether the plan rows of :meth:`explain` read the index called ``index``;
        ``None`` where this vendor's plan does not say which indexes it reads."""
        return None

    def plan_summary(self, plan: Sequence[Mapping[str, Any]]) -> str:
        """The plan rows of :meth:`explain` in one line, for people."""
        return " | ".join(
            " ".join(str(v) for v in row.values() if v not in (None, "")) for row in plan
        )

    def analyze_sql(self, quoted: str) -> str | None:
        """The statement that refreshes the planner's statistics of the (quoted) table, for
        an operator to run; ``None`` where the vendor has none."""
        return None

    def table_size(self, table: str, quoted: str) -> Statement | None:
        """The statement returning the bytes the table ``table`` takes on disk with its
        indexes (one integer, ``NULL`` when there is no such table); ``quoted`` is the
        name quoted for the connection. ``None`` where the vendor cannot tell."""
        return None
