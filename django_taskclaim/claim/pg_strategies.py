"""The strategies only PostgreSQL offers: ``advisory``, ``serializable`` and ``hold``."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.db import connections, models, transaction

from django_taskclaim.backends import PostgreSQL, for_alias
from django_taskclaim.backends.postgresql import table_key
from django_taskclaim.claim import keyed
from django_taskclaim.claim.base import Strategy
from django_taskclaim.claim.request import ClaimRequest
from django_taskclaim.claim.skip_locked import SkipLocked
from django_taskclaim.claim.statements import (
    claim_returning,
    compiled_candidates,
    kept_claim,
    run_claim,
)

if TYPE_CHECKING:
    pass


def advisory_table_key(model: type[models.Model]) -> int:
    """The int32 first half of the advisory-lock key pair used by the ``advisory`` strategy."""
    return table_key(model._meta.db_table)


class Advisory(Strategy):
    """PostgreSQL: candidates guarded by ``pg_try_advisory_xact_lock(table, hash(pk))``.

    One statement; the transaction-scoped locks vanish when it ends, so this works
    behind pgBouncer in transaction mode. The status is re-checked in the UPDATE.
    """

    name = "advisory"

    def claim(self, r: ClaimRequest) -> list[models.Model]:
        if r.opts.concurrency is not None:
            return keyed.claim_one_statement(r, lock="advisory")
        kept = kept_claim(r)
        if kept is not None:
            return run_claim(r, kept)
        sql, params = compiled_candidates(r, limit=max(r.n * 4, r.n + 8))
        candidates = cast(PostgreSQL, for_alias(r.db)).advisory_candidates_sql(sql, r.n)
        return claim_returning(r, candidates, (*params, advisory_table_key(r.model)))


class Serializable(Strategy):
    """PostgreSQL: plain SELECT + UPDATE inside a SERIALIZABLE transaction.

    Conflicting claimers get a serialization failure, retried inside the library; a
    claim that loses every retry claims nothing (:attr:`Strategy.conflict_means_taken`).
    """

    name = "serializable"
    conflict_means_taken = True

    def claim(self, r: ClaimRequest) -> list[models.Model]:
        if r.opts.concurrency is not None:

            def serializable() -> list[models.Model]:
                with transaction.atomic(using=r.db):
                    with connections[r.db].cursor() as cursor:
                        cursor.execute(cast(PostgreSQL, for_alias(r.db)).serializable_sql)
                    return keyed.claim_one_statement(r, lock="")

            return keyed.retry_key_conflicts(serializable, r.opts, r.db)
        with transaction.atomic(using=r.db):
            with connections[r.db].cursor() as cursor:
                cursor.execute(cast(PostgreSQL, for_alias(r.db)).serializable_sql)
            sql, params = compiled_candidates(r)
            return claim_returning(r, sql, params)


class Hold(Strategy):
    """PostgreSQL: ``FOR UPDATE SKIP LOCKED`` kept for the caller's whole transaction.

    Must be called inside ``transaction.atomic()``; the row locks (and a connection)
    are held until that transaction ends. A crash rolls the claim back by itself —
    including the attempt count, so a task that kills its worker is retried forever
    in this mode. Use for short jobs only.
    """

    name = "hold"
    needs_caller_atomic = True

    def claim(self, r: ClaimRequest) -> list[models.Model]:
        if r.opts.concurrency is not None:
            keyed.refuse_hold(r.opts)
        return SkipLocked().claim(r)
