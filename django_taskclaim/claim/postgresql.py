"""The strategies only PostgreSQL offers: ``advisory``, ``serializable`` and ``hold``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.db import connections, models, transaction

from django_taskclaim.backends import PostgreSQL, for_alias
from django_taskclaim.backends.postgresql import table_key
from django_taskclaim.claim import keyed
from django_taskclaim.claim.base import Strategy
from django_taskclaim.claim.skip_locked import SkipLocked
from django_taskclaim.claim.statements import _claim_returning, _compiled_candidates

if TYPE_CHECKING:
    from django_taskclaim.config.options import ClaimOptions


def advisory_table_key(model: type[models.Model]) -> int:
    """The int32 first half of the advisory-lock key pair used by the ``advisory`` strategy."""
    return table_key(model._meta.db_table)


class Advisory(Strategy):
    """PostgreSQL: candidates guarded by ``pg_try_advisory_xact_lock(table, hash(pk))``.

    One statement; the transaction-scoped locks vanish when it ends, so this works
    behind pgBouncer in transaction mode. The status is re-checked in the UPDATE.
    """

    name = "advisory"

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        if opts.concurrency is not None:
            return keyed.claim_one_statement(
                qs, n, opts=opts, lease=lease, worker=worker, cache_key=cache_key, lock="advisory"
            )
        sql, params = _compiled_candidates(qs, opts, max(n * 4, n + 8), cache_key)
        candidates = cast(PostgreSQL, for_alias(qs.db)).advisory_candidates_sql(sql, n)
        return _claim_returning(
            qs,
            candidates,
            (*params, advisory_table_key(qs.model)),
            n=n,
            opts=opts,
            lease=lease,
            worker=worker,
        )


class Serializable(Strategy):
    """PostgreSQL: plain SELECT + UPDATE inside a SERIALIZABLE transaction.

    Conflicting claimers get a serialization failure, retried inside the library; a
    claim that loses every retry claims nothing (:attr:`Strategy.conflict_means_taken`).
    """

    name = "serializable"
    conflict_means_taken = True

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        if opts.concurrency is not None:

            def serializable() -> list[models.Model]:
                with transaction.atomic(using=qs.db):
                    with connections[qs.db].cursor() as cursor:
                        cursor.execute(cast(PostgreSQL, for_alias(qs.db)).serializable_sql)
                    return keyed.claim_one_statement(
                        qs, n, opts=opts, lease=lease, worker=worker, cache_key=cache_key,
                        lock="",
                    )  # fmt: skip

            return keyed.retry_key_conflicts(serializable, opts, qs.db)
        with transaction.atomic(using=qs.db):
            with connections[qs.db].cursor() as cursor:
                cursor.execute(cast(PostgreSQL, for_alias(qs.db)).serializable_sql)
            sql, params = _compiled_candidates(qs, opts, n, cache_key)
            return _claim_returning(qs, sql, params, n=n, opts=opts, lease=lease, worker=worker)


class Hold(Strategy):
    """PostgreSQL: ``FOR UPDATE SKIP LOCKED`` kept for the caller's whole transaction.

    Must be called inside ``transaction.atomic()``; the row locks (and a connection)
    are held until that transaction ends. A crash rolls the claim back by itself —
    including the attempt count, so a task that kills its worker is retried forever
    in this mode. Use for short jobs only.
    """

    name = "hold"
    needs_caller_atomic = True

    def claim(
        self,
        qs: models.QuerySet,
        n: int,
        *,
        opts: ClaimOptions,
        lease: float,
        worker: str,
        cache_key: tuple[Any, ...] | None = None,
    ) -> list[models.Model]:
        if opts.concurrency is not None:
            keyed.refuse_hold(opts)
        return SkipLocked().claim(qs, n, opts=opts, lease=lease, worker=worker, cache_key=cache_key)
