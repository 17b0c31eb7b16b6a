"""The ``skip_locked`` strategy: claimers skip each other's locked rows, never wait."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction

from django_taskclaim.backends import for_connection
from django_taskclaim.claim import keyed
from django_taskclaim.claim.base import (
    Strategy,
    _mark_recovered,
    _order_by,
    apply_claim,
    claim_updates,
)
from django_taskclaim.claim.request import ClaimRequest
from django_taskclaim.claim.statements import (
    claim_returning,
    compiled_candidates,
    kept_claim,
    run_claim,
)
from django_taskclaim.db import DbNow

if TYPE_CHECKING:
    pass


class SkipLocked(Strategy):
    """``SELECT … FOR UPDATE SKIP LOCKED``: claimers skip each other's rows, never wait.

    PostgreSQL: one statement (``UPDATE … WHERE pk IN (SELECT … FOR UPDATE SKIP LOCKED)
    RETURNING``). MySQL 8 / MariaDB ≥ 10.6: one short transaction (locking SELECT +
    UPDATE), the lease computed from the database clock read in that SELECT.
    """

    name = "skip_locked"

    def _features_ok(self, conn: Any) -> bool:
        return bool(conn.features.has_select_for_update_skip_locked)

    def claim(self, r: ClaimRequest) -> list[models.Model]:
        conn = connections[r.db]
        if r.opts.concurrency is not None:
            if for_connection(conn).claims_in_one_statement:
                return keyed.claim_one_statement(r, lock="skip_locked")
            return keyed.claim_locked_in_transaction(r)
        if for_connection(conn).claims_in_one_statement:
            kept = kept_claim(r)
            if kept is not None:  # a worker's claims after its first: no text built
                return run_claim(r, kept)
            sql, params = compiled_candidates(r)
            lock = conn.ops.for_update_sql(
                skip_locked=True, of=(conn.ops.quote_name(r.model._meta.db_table),)
            )
            return claim_returning(r, f"{sql} {lock}", params)
        return self._claim_in_transaction(r)

    def _claim_in_transaction(self, r: ClaimRequest) -> list[models.Model]:
        qs, n, opts, lease, worker = r.qs, r.n, r.opts, r.lease, r.worker
        conn = connections[qs.db]
        of = ("self",) if conn.features.has_select_for_update_of else ()
        with transaction.atomic(using=qs.db):
            rows = list(
                qs.defer(None)  # every field loaded now: none is re-read lazily after the claim
                .order_by(*_order_by(opts, qs.db))
                .select_for_update(skip_locked=True, of=of)
                .annotate(_taskclaim_now=DbNow())[:n]
            )
            if not rows:
                return []
            recovered = {r.pk for r in rows if r.locked_until is not None}
            until = rows[0]._taskclaim_now + timedelta(seconds=lease)
            updates = claim_updates(opts, lease, worker)
            updates["locked_until"] = until
            done = (
                qs.model._base_manager.using(qs.db)
                .filter(pk__in=[r.pk for r in rows])
                .filter(opts.status_q("ready"))
                .update(**updates)
            )
            if done != len(rows):  # pragma: no cover - rows are locked by this transaction
                raise transaction.TransactionManagementError(
                    "locked rows changed under a claim; rolled back"
                )
        for row in rows:
            apply_claim(row, opts, until, worker)
            del row._taskclaim_now
        return _mark_recovered(rows, recovered)
