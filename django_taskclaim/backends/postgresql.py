"""What django-taskclaim sends to PostgreSQL: errors, clock, claims, completions and
diagnostics here; the lock statements in ``postgresql_locks.py`` and the wake-ups
(``NOTIFY`` / ``LISTEN``, the notify trigger) in ``postgresql_notify.py``, both parts of
:class:`PostgreSQL`."""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django_taskclaim.backends.base import ClaimColumns, DatabaseSQL
from django_taskclaim.backends.postgresql_locks import PostgreSQLLocks
from django_taskclaim.backends.postgresql_notify import PostgreSQLNotify
from django_taskclaim.backends.statement import Statement

#: SQLSTATEs worth a retry: serialization_failure, deadlock_detected.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})
#: SQLSTATE lock_not_available: a statement's wait ended by ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"
#: SQLSTATE unique_violation.
UNIQUE_VIOLATION = "23505"


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a psycopg (``sqlstate``) or psycopg2 (``pgcode``) error."""
    return getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)


def _int32(data: bytes) -> int:
    value = zlib.crc32(data)
    return value - (1 << 32) if value >= (1 << 31) else value


#: The first half of the advisory-lock key pair of every claim gate (the second half is
#: the table's key): ``SELECT * FROM pg_locks WHERE locktype = 'advisory' AND classid =
#: <this, as unsigned>`` lists the gates taken and waited for.
CLAIM_GATE_SPACE = _int32(b"django_taskclaim.claim_gate")

#: How long a transaction holding a claim gate may sit idle waiting for its client before
#: the server ends the session (``idle_in_transaction_session_timeout``, for that
#: transaction only). A healthy client sends its claim within a round trip.
CLAIM_GATE_IDLE_TIMEOUT = "5s"


#: The CTEs of the keyed claim (:meth:`PostgreSQL.claim_keyed`) that its parts share: the
#: candidates, those numbered per key, the rows picked.
_CANDIDATES, _RANKED, _PICKED = '"taskclaim_c"', '"taskclaim_r"', '"taskclaim_p"'


def table_key(table: str) -> int:
    """An int32 naming ``table`` (unquoted) in advisory-lock key pairs: the first half of
    the ``advisory`` strategy's row keys, the second half of the table's claim gate."""
    return _int32(table.encode())


def claim_gate_key(table: str) -> tuple[int, int]:
    """The advisory-lock key pair of ``table``'s claim gate."""
    return CLAIM_GATE_SPACE, table_key(table)


#: The literal text of each constant statement :meth:`PostgreSQL.execute_kept` prepared.
_LITERALS: dict[tuple[Any, ...], str] = {}


class PostgreSQL(PostgreSQLNotify, PostgreSQLLocks, DatabaseSQL):
    """PostgreSQL: ``INSERT … ON CONFLICT … RETURNING`` leases, ``pg_advisory_*`` locks."""

    vendor = "postgresql"
    engine_marker = "postgres"
    default_port = 5432
    pooler_mode_applies = True

    def is_transient(self, error: BaseException) -> bool:
        """Serialization failures and deadlocks (:data:`TRANSIENT_SQLSTATES`)."""
        return sqlstate(error) in TRANSIENT_SQLSTATES

    def is_lock_timeout(self, error: BaseException) -> bool:
        """``lock_not_available`` (:data:`LOCK_NOT_AVAILABLE`)."""
        return sqlstate(error) == LOCK_NOT_AVAILABLE

    def is_unknown_database(self, error: BaseException) -> bool:
        """``invalid_catalog_name`` (3D000). A refused connection carries no SQLSTATE in
        psycopg, so the server's message is read too (``FATAL: database "x" does not
        exist``; the word ``database`` and the quoted name survive ``lc_messages``
        only in English, where the SQLSTATE is missing)."""
        if sqlstate(error) == "3D000":
            return True
        text = str(error)
        return 'database "' in text and "does not exist" in text

    def is_unique_violation(
        self, error: BaseException, *, table: str, constraint: str, columns: Sequence[str]
    ) -> bool:
        """SQLSTATE ``unique_violation`` whose diagnostics name ``constraint`` (not the
        message text, which follows ``lc_messages``)."""
        if sqlstate(error) != UNIQUE_VIOLATION:
            return False
        diag = getattr(error, "diag", None)
        return getattr(diag, "constraint_name", None) == constraint

    # ------------------------------------------------------------------------- clock

    clock_sql: ClassVar[str] = "STATEMENT_TIMESTAMP()"
    clock_known = True

    # ------------------------------------------------------------------------ claims

    claim_strategies: ClassVar[frozenset[str]] = frozenset(
        {"cas", "skip_locked", "advisory", "serializable", "hold"}
    )
    pk_tie_break_is_free = False
    claims_in_one_statement = True
    completes_from_arrays = True
    partial_unique_constraints = True
    #: Run first in the transaction of the ``serializable`` strategy.
    serializable_sql: ClassVar[str] = "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"

    def opaque_param_sql(self, db_type: str) -> str:
        """``(SELECT CAST(%s AS <type>))``: for the status re-check of a write that finds
        its rows by primary key (a claim's UPDATE, a completion).

        In a one-row sub-select the value is a parameter to the planner, not a constant,
        so it cannot prove a partial claim/lease index's ``WHERE status = …`` from it.
        Written as a plain ``status = 'ready'`` the planner may scan that partial index
        for the row instead of looking the primary key up — and it does whenever the
        statistics say the state is rare (a large table of finished rows analysed while
        the queue was empty): every claim then reads every ready row, and a backlog
        drains in quadratic time. The re-check still applies to the newest row version
        (PostgreSQL re-evaluates it after waiting on a concurrent writer)."""
        return f"(SELECT CAST(%s AS {db_type}))"

    def _status_is(self, c: ClaimColumns) -> str:
        return f"{c.table}.{c.status} = {self.opaque_param_sql(c.status_type)}"

    def claim(
        self,
        c: ClaimColumns,
        candidates: Statement,
        *,
        processing: Any,
        ready: Any,
        lease: float,
        worker: str,
    ) -> Statement:
        """``WITH c AS MATERIALIZED (<candidates>) UPDATE … FROM c … RETURNING``.

        One statement, one round trip. The candidates live in a materialized CTE so they
        are computed exactly once: written as ``pk IN (SELECT … LIMIT n FOR UPDATE SKIP
        LOCKED)`` the planner may pick a nested-loop semi-join that re-runs the subquery
        per outer row, and each re-run skips the rows this very statement already
        updated and returns *new* ones — claiming more than ``n`` rows. Re-checking the
        status in the UPDATE keeps the claim safe even when the candidates took no row
        lock (PostgreSQL re-evaluates the condition on the newest row version).
        """
        cte = _CANDIDATES
        sets, set_params = self._claim_sets(c, processing=processing, lease=lease, worker=worker)
        sql = (
            f'WITH {cte}("pk", "prev") AS MATERIALIZED ({candidates.sql}) '
            f"UPDATE {c.table} SET {', '.join(sets)} FROM {cte} "
            f'WHERE {c.table}.{c.pk} = {cte}."pk" AND {self._status_is(c)} '
            f'RETURNING {c.returning}, {cte}."prev" IS NOT NULL'
        )
        return Statement(sql, (*candidates.params, *set_params, ready))

    def _claim_sets(
        self, c: ClaimColumns, *, processing: Any, lease: float, worker: str
    ) -> tuple[list[str], list[Any]]:
        """The SET items of a claim and their parameters: ``processing``, token and
        attempts + 1, the lease from the clock, then the optional columns
        (:attr:`ClaimColumns.claim_writes`: the holder)."""
        sets = [
            f"{c.status} = %s",
            f"{c.version} = {c.table}.{c.version} + 1",
            f"{c.attempts} = {c.table}.{c.attempts} + 1",
            f"{c.locked_until} = {self.clock_sql} + %s * INTERVAL '1 second'",
        ]
        written, params = self.written_sql(c.claim_writes, worker)
        return [*sets, *written], [processing, lease, *params]

    durability_sql: ClassVar[str | None] = "SHOW synchronous_commit"

    def commit_durability(self, value: Any) -> tuple[str, str] | None:
        """``synchronous_commit = off``: a commit returns before its WAL is flushed, and a
        server crash forgets the last ones (``local``, ``remote_write``, ``on`` and
        ``remote_apply`` all wait for the local flush)."""
        if str(value).lower() != "off":
            return None
        return (
            "error",
            "synchronous_commit is off: a commit returns before it is on disk, so a crash "
            "of the server may forget claims whose workers already run their tasks",
        )

    def claim_gate(self, table: str) -> Statement:
        """``pg_advisory_xact_lock(space, table key)`` (:func:`claim_gate_key`): the
        waiting statement takes a snapshot, but holds no row lock and no transaction id;
        the claim that follows takes its own snapshot once the gate is open, so it sees
        every row the claim before it took.

        The same statement sets ``idle_in_transaction_session_timeout`` for its
        transaction (:data:`CLAIM_GATE_IDLE_TIMEOUT`): where the gate and the claim are
        two round trips (server-side binding), a client frozen between them would
        otherwise hold every large claim of the table back for as long as it stays
        frozen; past the bound the server ends its session, and with it the transaction
        (nothing was claimed) and the gate."""
        return Statement(
            "SELECT pg_advisory_xact_lock(CAST(%s AS integer), CAST(%s AS integer)) "
            "FROM set_config('idle_in_transaction_session_timeout', %s, true)",
            (*claim_gate_key(table), CLAIM_GATE_IDLE_TIMEOUT),
        )

    def several_statements(self, settings_dict: Mapping[str, Any]) -> bool:
        """psycopg2 always; psycopg 3 unless ``OPTIONS["server_side_binding"]`` (Django's
        server-side binding cursor sends one statement per call)."""
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        options = settings_dict.get("OPTIONS") or {}
        return not (is_psycopg3 and options.get("server_side_binding") is True)

    def fetch_after(self, cursor: Any, first: Statement, then: Statement) -> list[Any]:
        """Both statements in one simple-protocol call; psycopg 3 keeps each one's result
        (moved past ``first``'s), psycopg2 only the last."""
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        cursor.execute(f"{first.sql}; {then.sql}", (*first.params, *then.params))
        if is_psycopg3:
            cursor.nextset()
        return list(cursor.fetchall())

    def claim_keyed(
        self,
        c: ClaimColumns,
        candidates: Statement,
        *,
        key: str,
        slot: str | None,
        limit: int,
        descending: Sequence[bool],
        processing: Any,
        ready: Any,
        lease: float,
        worker: str,
    ) -> Statement:
        """As :meth:`claim`, with the per-key choice in the same statement: the locked
        candidates (materialized once) are numbered per key in claim order (``pk`` last);
        a row is kept only while every claimable row of its key ahead of it is among them
        (its ``ahead`` count equals its number less one), so rows another claim holds
        locked are never overtaken; the free slots of each key are numbered from
        ``generate_series``, and the n-th row of a key takes its n-th free slot; a row
        without one stays ``ready``. Two
        claimers that pick the same slot meet the unique constraint: the later one's
        statement fails whole, and is run again by the caller."""
        picked = _PICKED
        parts = self._keyed_ranked(candidates, descending)
        params: list[Any] = [*candidates.params]
        if slot is None:
            parts.append(
                f'{picked} AS (SELECT "pk", "prev", 0 AS "slot" FROM {_RANKED} '
                f'WHERE "rn" <= 1 OR "key" IS NULL)'
            )
        else:
            parts += self._keyed_free_slots(c, key=key, slot=slot)
            params += [limit - 1, processing]
        sets, set_params = self._claim_sets(c, processing=processing, lease=lease, worker=worker)
        if slot is not None:
            sets.append(f'{slot} = {picked}."slot"')
        sql = (
            f"WITH {', '.join(parts)} "
            f"UPDATE {c.table} SET {', '.join(sets)} FROM {picked} "
            f'WHERE {c.table}.{c.pk} = {picked}."pk" AND {self._status_is(c)} '
            f'RETURNING {c.returning}, {picked}."prev" IS NOT NULL'
        )
        return Statement(sql, (*params, *set_params, ready))

    @staticmethod
    def _keyed_ranked(candidates: Statement, descending: Sequence[bool]) -> list[str]:
        """The first CTEs of :meth:`claim_keyed`: the candidates (``"taskclaim_c"``,
        materialized), then those a claim may take in key order, numbered per key
        (``"taskclaim_r"``: ``rn``). No parameters beyond the candidates'."""
        cte, ranked = _CANDIDATES, _RANKED
        order = ", ".join(
            f'"o{i}" {"DESC" if desc else "ASC"} NULLS LAST' for i, desc in enumerate(descending)
        )
        names = ", ".join(
            ['"pk"', '"prev"', '"key"', '"ahead"', *(f'"o{i}"' for i in range(len(descending)))]
        )
        return [
            f"{cte}({names}) AS MATERIALIZED ({candidates.sql})",
            f'{ranked} AS (SELECT * FROM (SELECT "pk", "prev", "key", "ahead", row_number() '
            f'OVER (PARTITION BY "key" ORDER BY {order + ", " if order else ""}"pk") AS "rn" '
            f'FROM {cte}) x WHERE "key" IS NULL OR "ahead" IS NULL OR "ahead" = "rn" - 1)',
        ]

    @staticmethod
    def _keyed_free_slots(c: ClaimColumns, *, key: str, slot: str) -> list[str]:
        """The last CTEs of :meth:`claim_keyed` for a model with a slot column: each key's
        free slots, numbered (``"taskclaim_f"``: ``fn``), and the n-th ranked row of a key
        with its n-th free slot (``"taskclaim_p"``). Parameters: the highest slot number,
        the processing value."""
        cte, ranked, free, picked = _CANDIDATES, _RANKED, '"taskclaim_f"', _PICKED
        return [
            f'{free} AS (SELECT k."key", s."slot", row_number() OVER '
            f'(PARTITION BY k."key" ORDER BY s."slot") AS "fn" '
            f'FROM (SELECT DISTINCT "key" FROM {cte} WHERE "key" IS NOT NULL) k '
            f'CROSS JOIN generate_series(0, CAST(%s AS integer)) AS s("slot") '
            f'WHERE NOT EXISTS (SELECT 1 FROM {c.table} h WHERE h.{key} = k."key" '
            f'AND h.{c.status} = %s AND h.{slot} = s."slot"))',
            f'{picked} AS (SELECT r."pk", r."prev", COALESCE(f."slot", 0) AS "slot" '
            f'FROM {ranked} r LEFT JOIN {free} f ON f."key" = r."key" AND f."fn" = r."rn" '
            f'WHERE r."key" IS NULL OR f."slot" IS NOT NULL)',
        ]

    def advisory_candidates_sql(self, candidates_sql: str, limit: int) -> str:
        """The first ``limit`` candidates (``pk``, ``prev``) whose transaction-scope advisory
        lock ``(table key, hashtext(pk))`` this transaction takes without waiting.

        Parameters: the candidates' parameters, then the table key (int32)."""
        return (
            f'SELECT c."pk", c."prev" FROM ({candidates_sql}) c("pk", "prev") '
            f'WHERE pg_try_advisory_xact_lock(%s, hashtext(c."pk"::text)) LIMIT {int(limit)}'
        )

    @staticmethod
    def array_param(values: list[Any]) -> Any:
        """One array parameter of :meth:`complete_many_sql`: integers as one array literal
        (``'{1,2,3}'``, read by the statement's ``::type[]`` cast), which the driver sends
        as one string instead of quoting each element in Python; anything else as the
        list itself (the driver's array adaptation)."""
        if all(type(v) is int for v in values):
            return "{" + ",".join(map(str, values)) + "}"
        return values

    def complete_many_sql(
        self,
        c: ClaimColumns,
        *,
        pk_type: str,
        version_type: str,
        results: list[tuple[str, str]],
        rows_as: str = "arrays",
    ) -> str:
        """``UPDATE … FROM <rows>``, fenced row by row. The rows come either as one array
        parameter per column (``unnest(pks, tokens[, one array per result column])``),
        or (``rows_as="json"``) as one JSON document, ``jsonb_to_recordset(%s::jsonb)``:
        ``[{"pk": …, "token": …, "r0": …}, …]``, typed by the record's column list. Either
        way the text is the same for every batch and no per-row parameter is formatted;
        the JSON form is cheaper to build on the client when rows carry result values
        (one ``json.dumps`` instead of quoting every array element), and each value is
        read by its column type's input function."""
        t = '"taskclaim_t"'
        sets = [f"{c.status} = %s", f"{c.version} = {c.table}.{c.version} + 1"]
        sets.append(f"{c.locked_until} = NULL")
        sets += self.written_sql(c.complete_writes)[0]  # the clock or NULL: no parameter
        typed = [('"pk"', pk_type), ('"token"', version_type)]
        for i, (column, db_type) in enumerate(results):
            alias = f'"r{i}"'
            sets.append(f"{column} = {t}.{alias}")
            typed.append((alias, db_type))
        if rows_as == "json":
            columns = ", ".join(f"{alias} {db_type}" for alias, db_type in typed)
            source = f"jsonb_to_recordset(%s::jsonb) AS {t}({columns})"
        else:
            arrays = ", ".join(f"%s::{db_type}[]" for _, db_type in typed)
            source = f"unnest({arrays}) AS {t}({', '.join(alias for alias, _ in typed)})"
        held = self.held_sql(c, f'{t}."pk"', f'{t}."token"')
        return f"UPDATE {c.table} SET {', '.join(sets)} FROM {source} WHERE {held}"

    # ------------------------------------------------------------ prepared statements
    def prepares(self, conn: Any) -> bool:
        """Whether Django's connection ``conn`` may prepare statements at all: its
        ``OPTIONS["prepare_threshold"]`` is set (Django leaves it ``None``, no prepared
        statement, so that a pooler in transaction mode keeps working); psycopg 3 only."""
        raw = conn.connection
        return raw is not None and getattr(raw, "prepare_threshold", None) is not None

    def execute_kept(
        self,
        conn: Any,
        sql: str,
        params: Sequence[Any],
        *,
        fetch: bool,
        constant: bool = False,
        prepare: bool = False,
    ) -> Any:
        """As the base, but where the caller allows it (``prepare``: :meth:`prepares` and
        no pooler in transaction mode declared), as a prepared statement (psycopg
        3, ``prepare=True``): the server parses and plans it once per connection, then
        each call sends only its parameters — the cost that dominates a claim of one row.
        A ``constant`` statement is prepared with its parameters written into its text
        (the server then plans it with every value known, as before: a partial index on
        the status still serves it); the others with parameters (the complete-many: rows
        found by primary key). Logged as Django logs a query while it logs any
        (``CaptureQueriesContext``, ``DEBUG``); errors become Django's. While the
        connection has ``execute_wrapper()`` hooks it goes unprepared, through them."""
        if not prepare or conn.execute_wrappers:
            return super().execute_kept(conn, sql, params, fetch=fetch)
        import psycopg  # deferred: only where Django's backend already imported it

        text, args = (self._literal(conn, sql, params), None) if constant else (sql, params)
        started = time.monotonic()
        with conn.wrap_database_errors, psycopg.Cursor(conn.connection) as cursor:
            cursor.execute(text, args, prepare=True)
            out = list(cursor.fetchall()) if fetch else int(cursor.rowcount)
        if conn.queries_logged:
            shown = text if constant else conn.ops.compose_sql(sql, params)
            conn.queries_log.append({"sql": shown, "time": f"{time.monotonic() - started:.3f}"})
        return out

    def _literal(self, conn: Any, sql: str, params: Sequence[Any]) -> str:
        """``sql`` with ``params`` written in as literals by the driver, kept per text and
        parameters (a worker sends a handful of such statements)."""
        key = (conn.alias, sql, tuple(params))
        text = _LITERALS.get(key)
        if text is None:
            if len(_LITERALS) >= 64:
                _LITERALS.clear()
            text = _LITERALS[key] = conn.ops.compose_sql(sql, params)
        return text

    # --------------------------------------------------------------------- diagnostics

    explains_plans = True

    def explain(self, sql: str, params: Sequence[Any] = ()) -> Statement:
        """``EXPLAIN (COSTS OFF) <sql>``: one text row per plan node (``QUERY PLAN``)."""
        return Statement(f"EXPLAIN (COSTS OFF) {sql}", tuple(params))

    def plan_uses_index(self, plan: Sequence[Mapping[str, Any]], index: str) -> bool:
        """A node reads ``index``: ``Index [Only] Scan [Backward] using <index>`` or
        ``Bitmap Index Scan on <index>`` (the name double-quoted where it needs it)."""
        name = re.escape(index)
        node = re.compile(rf'(?:\busing|Bitmap Index Scan on) (?:{name}|"{name}")(?:\s|$)')
        return any(node.search(str(v)) for row in plan for v in row.values())

    def plan_summary(self, plan: Sequence[Mapping[str, Any]]) -> str:
        """The plan's nodes, outermost first, joined by ``/``."""
        lines = (str(v).strip().removeprefix("->").strip() for row in plan for v in row.values())
        return " / ".join(line for line in lines if line)

    def table_size(self, table: str, quoted: str) -> Statement:
        """``pg_total_relation_size``: heap, TOAST and indexes (``NULL`` without the table;
        the name is resolved on the search path)."""
        return Statement("SELECT pg_total_relation_size(to_regclass(%s))", (quoted,))

    def analyze_sql(self, quoted: str) -> str:
        """``ANALYZE <table>``."""
        return f"ANALYZE {quoted}"
