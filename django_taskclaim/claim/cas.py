"""The ``cas`` strategy: an optimistic compare-and-set claim that works on every database."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction
from django.db.models import sql

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.claim import keyed
from django_taskclaim.claim.base import (
    Strategy,
    _mark_recovered,
    _order_by,
    _sort,
    candidates,
    claim_updates,
    read_claimed,
)
from django_taskclaim.claim.request import ClaimRequest
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.rules import status_recheck

if TYPE_CHECKING:
    pass


class CompareAndSet(Strategy):
    """Optimistic claim: read candidates, then ``UPDATE … WHERE pk=? AND version=? AND
    status=ready`` each; a row counts as claimed only when exactly one row was updated.

    Works on every database. Tries candidates in FIFO order and, after a collision,
    in random order among the remaining ones so that concurrent claimers spread out.
    On SQLite the whole batch is one conditional UPDATE (see ``_claim_sqlite``).
    """

    name = "cas"

    def claim(self, r: ClaimRequest) -> list[models.Model]:
        conn = connections[r.db]
        if r.opts.concurrency is not None:
            if for_connection(conn).one_writer_at_a_time:
                return keyed.claim_one_writer(r)
            return keyed.claim_compare_and_set(r)
        if (
            for_connection(conn).one_writer_at_a_time
            and conn.features.can_return_columns_from_insert
        ):
            return self._claim_sqlite(r)
        return self._claim_candidates(r)

    def _claim_sqlite(self, r: ClaimRequest) -> list[models.Model]:
        """SQLite runs one writer at a time, so the compare-and-set of a whole batch is one
        statement: ``UPDATE … WHERE pk IN (<n candidates>) AND status = ready RETURNING *``.

        The candidates are read first in the same transaction (SQLite has no old values
        in ``RETURNING``; the read tells which rows were recovered). With
        ``transaction_mode = "IMMEDIATE"`` the transaction holds the write lock from its
        start; otherwise a writer that committed in between makes SQLite refuse the
        write ("database is locked", retried) rather than use stale data. Inside the
        claim's transaction (:func:`~.scope.in_claim_transaction`, which has read the
        pause table) it adds no savepoint: an error rolls the whole claim back.
        """
        qs, n, opts, lease, worker = r.qs, r.n, r.opts, r.lease, r.worker
        base = qs.model._base_manager.using(qs.db)
        with transaction.atomic(using=qs.db, savepoint=False):
            picked = list(candidates(qs, opts, n))
            if not picked:
                return []
            target = base.filter(pk__in=[p["pk"] for p in picked]).filter(opts.status_q("ready"))
            query = target.query.chain(sql.UpdateQuery)
            query.add_update_values(claim_updates(opts, lease, worker))
            update_sql, params = query.get_compiler(qs.db).as_sql()
            rows = list(base.raw(for_alias(qs.db).returning_all_sql(update_sql), params))
        recovered = {p["pk"] for p in picked if p["locked_until"] is not None}
        return _sort(_mark_recovered(rows, recovered), opts.ordering)

    def _claim_candidates(self, r: ClaimRequest) -> list[models.Model]:
        qs, n, opts, lease, worker = r.qs, r.n, r.opts, r.lease, r.worker

        base = qs.model._base_manager.using(qs.db)
        k = max(n, int(taskclaim_settings.CAS_CANDIDATES))
        updates = claim_updates(opts, lease, worker)
        recheck = status_recheck(opts, "ready", qs.db)
        won: dict[Any, int] = {}  # pk -> the token this claim wrote
        recovered: set[Any] = set()
        for _round in range(8):
            rows = list(
                qs.exclude(pk__in=list(won))
                .order_by(*_order_by(opts, qs.db))
                .values_list("pk", "version", "locked_until")[:k]
            )
            if not rows:
                break
            collided = False
            while rows and len(won) < n:
                index = random.randrange(len(rows)) if collided else 0
                pk, version, prev = rows.pop(index)
                hit = base.filter(pk=pk, version=version).filter(recheck).update(**updates)
                if hit == 1:
                    won[pk] = version + 1
                    if prev is not None:
                        recovered.add(pk)
                else:
                    collided = True
            if len(won) >= n or not collided:
                break
        if not won:
            return []
        return _sort(_mark_recovered(read_claimed(base, opts, won), recovered), opts.ordering)
