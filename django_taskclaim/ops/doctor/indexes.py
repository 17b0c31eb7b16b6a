"""The doctor's index checks: the claim and lease indexes are in the database (asked of
its introspection, not of the models) and the claim and reap queries read them (their
plans, read with the vendor's ``EXPLAIN``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django_taskclaim.claim.base import candidates
from django_taskclaim.claim.statements import compile_queryset
from django_taskclaim.config import bounds
from django_taskclaim.config.settings import BOUNDS, taskclaim_settings
from django_taskclaim.model.indexes import (
    claim_columns_serve,
    claim_index_text,
    lease_columns_serve,
    lease_index_text,
    serves_claim,
    serves_lease,
)
from django_taskclaim.ops.doctor.context import ModelContext
from django_taskclaim.ops.doctor.findings import Finding

CLAIM_INDEX, CLAIM_PLAN, LEASE_INDEX, LEASE_PLAN = ("TC-D010", "TC-D011", "TC-D012", "TC-D013")


def declared_claim_index(model: Any, status_field: str) -> Any | None:
    """The first of ``Meta.indexes`` that system check ``taskclaim.W001`` counts as
    serving the claim query, or ``None``."""
    return next((i for i in model._meta.indexes if serves_claim(i, status_field)), None)


def declared_lease_index(model: Any, status_field: str) -> Any | None:
    """The first of ``Meta.indexes`` led by ``locked_until`` (partial on the status or
    plain) or by the status then ``locked_until``: the reap query's index, or ``None``."""
    return next((i for i in model._meta.indexes if serves_lease(i, status_field)), None)


def database_indexes(ctx: ModelContext) -> dict[str, list[str]]:
    """The indexes the database has on the model's table: name → columns, in order."""
    with ctx.conn.cursor() as cursor:
        constraints = ctx.conn.introspection.get_constraints(cursor, ctx.table)
    return {name: list(c["columns"]) for name, c in constraints.items() if c.get("index")}


def read_plan(ctx: ModelContext, queryset: Any) -> list[dict[str, Any]]:
    """The plan of ``queryset``'s SELECT (compiled as the strategies compile it), read
    without running it: one mapping of column name to value per row of the plan."""
    text, params = compile_queryset(queryset)
    statement = ctx.sql.explain(text, params)
    with ctx.conn.cursor() as cursor:
        cursor.execute(statement.sql, statement.params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def claim_query(ctx: ModelContext) -> Any:
    """The candidates SELECT of a claim of ``limits.explain_limit`` rows."""
    return candidates(ctx.rows().claimable(), ctx.opts, ctx.limits.explain_limit)


def reap_query(ctx: ModelContext) -> Any:
    """The SELECT of one reap batch: pks of expired leases, ``TASKCLAIM_REAP_BATCH`` at most."""
    batch = bounds.number(
        taskclaim_settings.REAP_BATCH, "TASKCLAIM_REAP_BATCH", BOUNDS["REAP_BATCH"]
    )
    return ctx.rows().expired().order_by().values_list("pk", flat=True)[:batch]


def _field_list(ctx: ModelContext) -> list[str]:
    """``ClaimMeta.ordering`` as index fields (``pk`` named by its field)."""
    pk = str(ctx.model._meta.pk.name)
    fields = []
    for item in ctx.opts.ordering:
        name = item.lstrip("-")
        fields.append(item.replace(name, pk) if name == "pk" else item)
    return fields


def _claim_suggestion(ctx: ModelContext, partial: bool) -> str:
    return claim_index_text(
        _field_list(ctx),
        status_field=ctx.opts.status_field,
        ready=ctx.opts.value("ready"),
        name=f"{ctx.table[:21]}_claim_st",
        partial=partial,
    )


def _lease_suggestion(ctx: ModelContext, partial: bool) -> str:
    return lease_index_text(
        status_field=ctx.opts.status_field,
        processing=ctx.opts.value("processing"),
        name=f"{ctx.table[:21]}_lease_st",
        partial=partial,
    )


def _claim_serves(columns: list[str], ctx: ModelContext) -> bool:
    return claim_columns_serve(columns, ctx.opts.status_column)


def _lease_serves(columns: list[str], ctx: ModelContext) -> bool:
    until = str(ctx.model._meta.get_field("locked_until").column)
    return lease_columns_serve(columns, ctx.opts.status_column, until)


@dataclass(frozen=True)
class IndexKind:
    """What differs between the claim index and the lease index."""

    name: str
    index_id: str
    plan_id: str
    query: Callable[[ModelContext], Any]
    declared: Callable[[Any, str], Any | None]
    serves: Callable[[list[str], ModelContext], bool]
    suggestion: Callable[[ModelContext, bool], str]
    #: Whether the index is useless without its condition (the claim index holds the
    #: ``ready`` rows in claim order; a plain one walks past every finished row).
    needs_condition: bool


CLAIM = IndexKind(
    "claim",
    CLAIM_INDEX,
    CLAIM_PLAN,
    claim_query,
    declared_claim_index,
    _claim_serves,
    _claim_suggestion,
    True,
)
LEASE = IndexKind(
    "lease",
    LEASE_INDEX,
    LEASE_PLAN,
    reap_query,
    declared_lease_index,
    _lease_serves,
    _lease_suggestion,
    False,
)


def check_index(ctx: ModelContext, kind: IndexKind) -> list[Finding]:
    """``TC-D010`` / ``TC-D012``: the claim / lease index is in the database, or another
    index that leads with the same column; ``TC-D011`` / ``TC-D013``: the claim / reap
    query reads it (judged from ``limits.plan_min_rows`` rows)."""
    alias, label = ctx.alias, ctx.label
    partial = bool(ctx.conn.features.supports_partial_indexes)
    declared = kind.declared(ctx.model, ctx.opts.status_field)
    indexes = database_indexes(ctx)
    others = [name for name, columns in sorted(indexes.items()) if kind.serves(columns, ctx)]
    unfiltered = (
        kind.needs_condition
        and declared is not None
        and declared.condition is not None
        and not partial
    )
    plan = read_plan(ctx, kind.query(ctx)) if ctx.sql.explains_plans else None
    summary = ctx.sql.plan_summary(plan) if plan is not None else "not read on this database"
    total = ctx.stats.total
    if declared is not None and declared.name in indexes and not unfiltered:
        serving = declared.name
        found = Finding(
            kind.index_id, "ok", alias, f"the {kind.name} index {serving} is in the database", label
        )
    elif others:
        serving = others[0]
        found = Finding(
            kind.index_id,
            "ok",
            alias,
            f"index {serving} serves the {kind.name} query",
            label,
            detail=f"its columns: {', '.join(indexes[serving])}",
        )
    else:
        in_database = declared is not None and declared.name in indexes
        return [
            _index_missing(
                ctx,
                kind,
                declared,
                in_database=in_database,
                partial=partial,
                summary=summary,
                total=total,
            )
        ]
    return [found, _plan_finding(ctx, kind, serving, plan, summary)]


def _index_missing(
    ctx: ModelContext,
    kind: IndexKind,
    declared: Any | None,
    *,
    in_database: bool,
    partial: bool,
    summary: str,
    total: int,
) -> Finding:
    """``TC-D010`` / ``TC-D012`` where no index in the database serves the query: none is
    declared, the declared one is not in the database, or it is there without its
    condition (a database without partial indexes)."""
    alias, label, limits = ctx.alias, ctx.label, ctx.limits
    fix_tail = f" to {label}'s Meta.indexes, then python manage.py makemigrations and migrate"
    if declared is None:
        return Finding(
            kind.index_id,
            "warning",
            alias,
            f"no index serves the {kind.name} query",
            label,
            detail=f"{total} rows; plan: {summary}",
            fix=f"Add {kind.suggestion(ctx, partial)}{fix_tail} (or inherit "
            "ClaimableModel.Meta, or use django_taskclaim.models.claim_indexes(...)).",
        )
    if not in_database:
        big = total >= limits.plan_min_rows
        app = ctx.model._meta.app_label
        return Finding(
            kind.index_id,
            "error" if big else "warning",
            alias,
            f"the {kind.name} index {declared.name} is declared but not in the database",
            label,
            detail=f"{total} rows (an error from {limits.plan_min_rows}); plan: {summary}",
            fix=f"python manage.py migrate {app}; if every migration is applied, the index "
            f"was dropped outside them: python manage.py sqlmigrate {app} <migration> "
            "prints the statement that creates it.",
        )
    # declared, in the database, without its condition
    return Finding(
        kind.index_id,
        "warning",
        alias,
        f"{ctx.conn.display_name} has no partial indexes: {declared.name} holds every "
        "row, finished ones too",
        label,
        detail="claims walk the index in claim order past every finished row before "
        f"they find a ready one; {total} rows; plan: {summary}",
        fix=f"Add {kind.suggestion(ctx, False)}{fix_tail}.",
    )


def _plan_finding(
    ctx: ModelContext,
    kind: IndexKind,
    serving: str,
    plan: list[dict[str, Any]] | None,
    summary: str,
) -> Finding:
    alias, label, limits = ctx.alias, ctx.label, ctx.limits
    uses = ctx.sql.plan_uses_index(plan, serving) if plan is not None else None
    detail = f"plan: {summary}"
    if uses is None:
        return Finding(
            kind.plan_id,
            "ok",
            alias,
            f"the {kind.name} query's plan is not judged: {ctx.conn.display_name}'s plan "
            "does not name its indexes here",
            label,
        )
    if uses:
        return Finding(
            kind.plan_id,
            "ok",
            alias,
            f"the {kind.name} query reads {serving}",
            label,
            detail=detail,
        )
    total = ctx.stats.total
    if total < limits.plan_min_rows:
        return Finding(
            kind.plan_id,
            "ok",
            alias,
            f"the {kind.name} query does not read {serving} yet: at {total} rows the planner "
            f"rightly prefers a scan (judged from {limits.plan_min_rows} rows)",
            label,
            detail=detail,
        )
    analyze = ctx.sql.analyze_sql(ctx.conn.ops.quote_name(ctx.table))
    fix = (
        f"Refresh the planner's statistics: {analyze} (in python manage.py dbshell)"
        if analyze
        else "Refresh the database's planner statistics"
    )
    if kind is CLAIM:
        fix += (
            f"; if it still does not read {serving}, make {label}'s ClaimMeta.ordering "
            f"{list(ctx.opts.ordering)} follow the index's columns"
        )
    return Finding(
        kind.plan_id,
        "warning",
        alias,
        f"the {kind.name} query does not read {serving}",
        label,
        detail=f"{total} rows; {detail}",
        fix=fix + ".",
    )
