"""The SQL django-taskclaim sends to a database, one class per vendor.

Each vendor has one subclass of :class:`DatabaseSQL` (``postgresql.py``, ``mysql.py``,
``sqlite.py``) and one shared instance of it (:func:`django_taskclaim.backends.for_connection`).
That instance is the only place that knows what a vendor can do and what text it is sent,
so "what do we send to MySQL?" is answered by reading ``mysql.py`` (and this file, for
what the vendors share; the lock statements are :class:`~.base_locks.LockSQL`, in
``base_locks.py``, the wake-ups :class:`~.base_notify.NotifySQL`, in ``base_notify.py``,
and the diagnostics :class:`~.base_diagnostics.DiagnosticsSQL`, in
``base_diagnostics.py``: :class:`DatabaseSQL` subclasses the three).

**What belongs here** — every statement text and every vendor decision:

- lease locks (``lease_*``): acquire, renew, verify and release a row of the
  ``taskclaim.Lease`` table, fenced by its token;
- advisory locks (``advisory_*``, the ``lock_timeout`` statements, ``server_port``) and
  what a vendor's advisory locks are (:attr:`DatabaseSQL.advisory_kind`);
- the classification of driver errors (:meth:`DatabaseSQL.is_transient`,
  :meth:`DatabaseSQL.is_lock_timeout`), asked for through :mod:`django_taskclaim.db`;
- and, as they move here, the claim statements of the strategies, the fenced
  complete-many, the database clock expression and ``NOTIFY`` / ``LISTEN``: each as further
  named methods (or class attributes) on these same classes, one section per subject, a
  base default where the vendors share the text and an override where they do not.

Code elsewhere asks the instance (``for_connection(conn).lease_acquire(...)``) and never
reads ``connection.vendor`` itself, nor writes SQL.

**Conventions**

- A method named for a statement and ending in ``_sql`` returns its text; one returning
  a :class:`Statement` returns text and parameters together; one taking a ``cursor``
  runs its statements on it (several where the vendor needs several) and interprets the
  result. Retrying, transactions and connection handling stay with the caller.
- Values always travel as parameters (``%s``); identifiers are quoted with the
  connection's ``ops.quote_name`` (see :class:`~.base_locks.LeaseTable`). Text that goes through
  ``execute()`` with parameters doubles a literal ``%``.
- The instances hold no connection state: one per vendor serves every connection and
  thread.
- A capability a vendor lacks is a class attribute saying so (``advisory_kind = None``,
  ``supports_lease_locks = False``); its statement methods then raise
  :class:`NotImplementedError`, and callers check the attribute first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from django.apps import apps

from django_taskclaim.backends.base_diagnostics import DiagnosticsSQL
from django_taskclaim.backends.base_locks import LockSQL
from django_taskclaim.backends.base_notify import NotifySQL
from django_taskclaim.backends.statement import Statement

#: What a claim or completion statement writes to an optional column, as
#: :attr:`ClaimColumns.claim_writes` says (the values of
#: :class:`django_taskclaim.claim.resets.Write` that a statement can write): the
#: claiming worker (a parameter), the statement's clock, ``NULL``.
WRITE_HOLDER, WRITE_CLOCK, WRITE_CLEAR = "holder", "clock", "clear"


@dataclass(frozen=True)
class ClaimColumns:
    """A claimable model's table and the claim columns, quoted for one connection.

    ``claim_writes`` / ``complete_writes``: what a claim / a completion writes to the
    model's optional columns, ``(quoted column, what)`` pairs in the order of the table
    that decides it (:data:`django_taskclaim.claim.resets.RESETS`; ``what``: see
    :meth:`DatabaseSQL.written_sql`); ``returning`` lists every concrete column,
    qualified by the table, in field order.
    """

    table: str
    pk: str
    status: str
    version: str
    attempts: str
    locked_until: str
    returning: str
    #: The status column's type for a ``CAST`` (``varchar(16)``, ``smallint``, …).
    status_type: str = "text"
    claim_writes: tuple[tuple[str, str], ...] = ()
    complete_writes: tuple[tuple[str, str], ...] = ()


class DatabaseSQL(NotifySQL, DiagnosticsSQL, LockSQL):
    """The statements of one database vendor; this base holds what vendors share.

    An instance for a vendor django-taskclaim has no subclass for supports nothing
    beyond error classification (which then finds nothing transient).
    """

    #: Django's ``connection.vendor`` this class speaks to.
    vendor: str = ""
    #: A substring of ``DATABASES[...]["ENGINE"]`` naming this vendor, for the checks that
    #: read settings only and must not connect (:func:`~django_taskclaim.backends.for_engine`).
    engine_marker: ClassVar[str | None] = None
    #: The port the vendor's server listens on when ``PORT`` is not set.
    default_port: ClassVar[int | None] = None
    #: Whether ``TASKCLAIM_POOLER_MODE`` describes a pooler in front of this database
    #: (pgBouncer in front of PostgreSQL): session state may then not survive a transaction.
    pooler_mode_applies: ClassVar[bool] = False
    #: Whether two inserts of one unique key inside transactions can deadlock on the
    #: duplicate check (InnoDB): :mod:`django_taskclaim.model.unique` then never lets an insert
    #: wait there.
    duplicate_checks_deadlock: ClassVar[bool] = False

    def __init__(self, vendor: str | None = None) -> None:
        if vendor is not None:
            self.vendor = vendor

    def __repr__(self) -> str:
        return f"<{type(self).__name__} vendor={self.vendor!r}>"

    # ------------------------------------------------------------ error classification

    def is_transient(self, error: BaseException) -> bool:
        """Whether the driver's ``error`` is a deadlock, a serialization failure or a busy
        database: worth running the same statement again."""
        return False

    def is_lock_timeout(self, error: BaseException) -> bool:
        """Whether the driver's ``error`` is the statement's lock wait timing out (the
        session's lock timeout, as :meth:`set_lock_timeout` sets it)."""
        return False

    def is_unknown_database(self, error: BaseException) -> bool:
        """Whether connecting failed because the database named in the settings does
        not exist on the server (waiting will not make it appear)."""
        return False

    def is_unique_violation(
        self, error: BaseException, *, table: str, constraint: str, columns: Sequence[str]
    ) -> bool:
        """Whether the driver's ``error`` is a violation of the unique constraint named
        ``constraint`` on ``table`` over ``columns`` (unquoted names), and of no other
        constraint. A vendor that cannot tell says ``False``: the caller then re-raises."""
        return False

    # ------------------------------------------------------------------------- clock

    #: The database clock of claims, row leases, schedules and timestamps: fixed for one
    #: statement, and zone-proof (never a session-zone clock).
    clock_sql: ClassVar[str] = "CURRENT_TIMESTAMP"

    #: Whether :attr:`clock_sql` is known to be this vendor's clock (an unknown vendor's
    #: time is then read from the web server instead, see :meth:`read_clock`).
    clock_known: ClassVar[bool] = False

    def now_sql(self, *, use_tz: bool = True) -> str:
        """:attr:`clock_sql` (``%`` is not escaped: double it in raw SQL sent with
        parameters). ``use_tz``: Django's ``USE_TZ`` (how datetimes are stored)."""
        return self.clock_sql

    def read_clock(self, *, use_tz: bool = True) -> Statement | None:
        """The statement reading the database clock (one value), or ``None`` when
        :attr:`clock_known` is false."""
        return Statement(f"SELECT {self.now_sql(use_tz=use_tz)}") if self.clock_known else None

    # ------------------------------------------------------------------------ claims

    #: The claim strategies that work here (``skip_locked`` also needs Django's
    #: ``has_select_for_update_skip_locked``); ``cas`` works everywhere.
    claim_strategies: ClassVar[frozenset[str]] = frozenset({"cas", "skip_locked"})
    #: Whether the primary key is a free last tie-break of the claim's ORDER BY (InnoDB
    #: and SQLite append it to every index entry; PostgreSQL's claim index lacks it).
    pk_tie_break_is_free: ClassVar[bool] = True
    #: Whether one writer runs at a time (SQLite): a compare-and-set of a whole batch is
    #: then one ``UPDATE … WHERE pk IN (…) AND status = ready RETURNING *``.
    one_writer_at_a_time: ClassVar[bool] = False
    #: Whether reading the clock is an in-process call whose ``now()`` moves in
    #: millisecond steps (SQLite): read it each time instead of adding elapsed time to a
    #: cached reading, which could land after a later ``now()`` within the same step.
    clock_in_process: ClassVar[bool] = False
    #: Whether :meth:`claim` (one statement, candidates and UPDATE … RETURNING) exists.
    claims_in_one_statement: ClassVar[bool] = False
    #: Whether :meth:`complete_many_sql` (one UPDATE from per-row arrays) exists.
    completes_from_arrays: ClassVar[bool] = False
    #: Whether a unique constraint with a condition (a partial unique index) is enforced
    #: here; MySQL / MariaDB have no partial indexes and skip such a constraint.
    partial_unique_constraints: ClassVar[bool] = False

    @staticmethod
    def array_param(values: list[Any]) -> Any:
        """One array parameter of :meth:`complete_many_sql`, as the vendor reads it best
        (here: the list, adapted by the driver)."""
        return values

    def copy_rows_sql(self, table: str, columns: Sequence[str], select_sql: str) -> str:
        """``INSERT INTO <table> (<columns>) <select>``: the copy of an archive move
        (:mod:`django_taskclaim.recovery.archive`); ``table`` and ``columns`` quoted, the SELECT
        compiled by the ORM (its parameters are the statement's)."""
        return f"INSERT INTO {table} ({', '.join(columns)}) {select_sql}"

    def delete_by_pk_sql(self, table: str, pk: str, n: int) -> str:
        """``DELETE FROM <table> WHERE <pk> IN (%s, …)`` for ``n`` keys, without the ORM's
        cascade collection (the archive refuses models other rows point at)."""
        return f"DELETE FROM {table} WHERE {pk} IN ({', '.join(['%s'] * int(n))})"

    def tokens_match(self, pk: str, version: str, pairs: Sequence[tuple[Any, Any]]) -> Statement:
        """``(<pk>, <version>) IN ((%s, %s), …)``, one pair per claimed row (``pk`` and
        ``version`` the quoted, table-qualified columns; ``pairs`` the prepared values): a
        row-value comparison (standard SQL) the ORM has no public way to say, compiled
        once per batch instead of many ``OR``-ed conditions."""
        placeholders = ", ".join(["(%s, %s)"] * len(pairs))
        params = tuple(value for pair in pairs for value in pair)
        return Statement(f"({pk}, {version}) IN ({placeholders})", params)

    def held_sql(self, c: ClaimColumns, pk: str, token: str) -> str:
        """The fence (:func:`~django_taskclaim.rules.held_q`) in statement text, for a
        write that reads each row's primary key and claimed token from ``pk`` and
        ``token`` (SQL expressions): that primary key, that token, and the status
        re-checked (:meth:`opaque_param_sql`; one parameter, the held state's value)."""
        return (
            f"{c.table}.{c.pk} = {pk} AND {c.table}.{c.version} = {token} "
            f"AND {c.table}.{c.status} = {self.opaque_param_sql(c.status_type)}"
        )

    def value_per_row(self, pk: str, column: str, branches: Sequence[tuple[Any, Any]]) -> Statement:
        """``CASE <pk> WHEN %s THEN %s … ELSE <column> END``: each row of a batched write
        its own value of ``column`` (``branches``: prepared (pk, value) pairs; ``pk`` and
        ``column`` quoted and table-qualified); other rows keep theirs."""
        whens = " ".join(["WHEN %s THEN %s"] * len(branches))
        params = tuple(value for branch in branches for value in branch)
        return Statement(f"CASE {pk} {whens} ELSE {column} END", params)

    def not_null_sql(self, quoted_column: str) -> str:
        """The condition of a partial index over the rows where a column is set."""
        return f"{quoted_column} IS NOT NULL"

    def opaque_param_sql(self, db_type: str) -> str:
        """SQL for one parameter that the planner must not treat as a constant, so that
        a status re-check written with it never makes a partial index look usable (see
        the PostgreSQL version); plain ``%s`` where planners need no such care."""
        return "%s"

    def written_sql(
        self, writes: Sequence[tuple[str, str]], holder: str | None = None
    ) -> tuple[list[str], list[Any]]:
        """The SET items of ``writes`` (:attr:`ClaimColumns.claim_writes` or
        ``complete_writes``) and their parameters: ``holder`` (:data:`WRITE_HOLDER`,
        only where a ``holder`` is given), the clock (:data:`WRITE_CLOCK`), ``NULL``
        (:data:`WRITE_CLEAR`); ``ValueError`` for anything else."""
        sets: list[str] = []
        params: list[Any] = []
        for column, what in writes:
            if what == WRITE_HOLDER and holder is not None:
                sets.append(f"{column} = %s")
                params.append(holder)
            elif what in (WRITE_CLOCK, WRITE_CLEAR):
                sets.append(f"{column} = {self.clock_sql if what == WRITE_CLOCK else 'NULL'}")
            else:
                raise ValueError(f"a {self.vendor} statement cannot write {what!r} to {column}")
        return sets, params

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
        """Claim the rows the ``candidates`` SELECT (``pk``, previous ``locked_until``)
        picks, in one statement: status ``processing``, ``version`` and ``attempts`` + 1,
        lease until the clock + ``lease`` seconds, held by ``worker``, re-checking that
        each is still ``ready``. Returns every column of :attr:`ClaimColumns.returning`,
        then whether the row was recovered (its previous ``locked_until`` was set)."""
        raise NotImplementedError(f"{self.vendor} claims in a transaction, not one statement")

    def claim_gate(self, table: str) -> Statement | None:
        """The statement a large claim of ``table`` (unquoted name) runs first, in its own
        transaction, to take its turn: it waits while another large claim of the same
        table runs, and the turn ends with that transaction. ``None`` where claims need
        no gate (MySQL / MariaDB claim in a transaction of their own; SQLite has one
        writer at a time).

        Why: concurrent ``FOR UPDATE SKIP LOCKED`` claims each walk the head of the claim
        index and step over every row the others hold locked until they commit, so
        each one's cost grows with the number of claims in flight. Claims that take
        turns never step over each other's rows, and a waiting claim costs nothing.

        Where the gate and its claim go as two round trips, the statement also bounds
        how long its transaction may wait idle for the client: a client frozen between
        the two loses its session (and the gate) instead of holding every other large
        claim back."""
        return None

    def several_statements(self, settings_dict: Mapping[str, Any]) -> bool:
        """Whether one ``execute()`` may carry several statements (the driver binds
        parameters on the client): :meth:`fetch_after` then sends a gate and its claim in
        one round trip."""
        return False

    def fetch_after(self, cursor: Any, first: Statement, then: Statement) -> list[Any]:
        """Run ``first`` and ``then`` in one ``execute()`` (one round trip; one implicit
        transaction in autocommit) and return the rows of ``then``; only where
        :meth:`several_statements`."""
        raise NotImplementedError(f"{self.vendor} sends one statement per call")

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
        """:meth:`claim` for a model with a concurrency key: the ``candidates`` SELECT
        returns ``pk``, previous ``locked_until``, the key, how many claimable rows of
        the key come before the row (``NULL``: not compared), then one column per claim
        order item (``descending[i]``: that item sorts descending). Of each key value it
        claims the first rows in claim order, none after a row ahead that it does not
        have, as many as the key has free slots: a slot
        number ``0 … limit-1`` no ``processing`` row of that key holds, written to the
        (quoted) ``slot`` column; without one (``limit`` 1) one row per key. Rows whose key
        is ``NULL`` are not limited. Returns what :meth:`claim` returns."""
        raise NotImplementedError(f"{self.vendor} claims in a transaction, not one statement")

    def returning_all_sql(self, update_sql: str) -> str:
        """``update_sql`` (an UPDATE the ORM compiled) returning every column of the rows
        it wrote."""
        return f"{update_sql} RETURNING *"

    def complete_many_sql(
        self,
        c: ClaimColumns,
        *,
        pk_type: str,
        version_type: str,
        results: list[tuple[str, str]],
        rows_as: str = "arrays",
    ) -> str:
        """Complete many claimed rows, fenced row by row on their tokens: ``done``,
        ``version`` + 1, lease cleared, ``finished_at`` stamped, and per row the values of
        the ``results`` columns (``(quoted column, database type)``), all in one UPDATE.

        Parameters: the done value, then the rows — ``rows_as="arrays"``: the pks, the
        tokens, one list per result column; ``"json"``: one JSON array of objects with
        the keys ``pk``, ``token``, ``r0``, ``r1``, … — then the processing value."""
        raise NotImplementedError(f"{self.vendor} completes rows with the ORM")

    # -------------------------------------------------------------------- paused queues

    def paused_queues(self, connection: Any) -> Statement:
        """Every paused queue: the ``(model, queue)`` rows of the ``taskclaim.QueuePause``
        table (``queue = ''``: every queue of the model). Read by the claims' snapshot of
        the pauses (:mod:`django_taskclaim.claim.paused`)."""
        # Looked up in the app registry, not imported: the models sit above the backends.
        qn = connection.ops.quote_name
        meta = apps.get_model("taskclaim", "QueuePause")._meta
        model, queue = (qn(cast(Any, meta.get_field(name)).column) for name in ("model", "queue"))
        return Statement(f"SELECT {model}, {queue} FROM {qn(meta.db_table)}", ())

    # ------------------------------------------------------------------------ events

    def event_insert(self, connection: Any, name: str) -> Statement:
        """Insert the ``taskclaim.TaskEvent`` row of ``name``, not emitted, unless one
        exists; on an uncommitted row of the same name it waits for that transaction.
        Never an error on a duplicate and never a share lock on the existing row (the
        caller then locks it ``FOR UPDATE``). Here ``ON CONFLICT (name) DO NOTHING``,
        which takes no lock on the existing row at all."""
        table, column = event_table(connection)
        return Statement(
            f"INSERT INTO {table} ({column}) VALUES (%s) ON CONFLICT ({column}) DO NOTHING",
            (name,),
        )

    # ----------------------------------------------------------------- connections

    #: The cheapest statement that proves a connection still answers.
    ping_sql: ClassVar[str] = "SELECT 1"

    #: The statement reading how this session's commits reach the disk (one value), or
    #: ``None`` where there is nothing to ask (:meth:`commit_durability`).
    durability_sql: ClassVar[str | None] = None

    def commit_durability(self, value: Any) -> tuple[str, str] | None:
        """``(severity, why)`` when :attr:`durability_sql`'s ``value`` says a commit the
        client was told of may be forgotten by a crash of the server, else ``None``.

        A forgotten claim is worse than a re-run: its worker already runs the task, and
        the row is ``ready`` again under the same token, so the next claim hands out
        the token the first worker still holds — fencing can no longer tell the two
        apart, and the task runs twice within a lease."""
        return None

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
        """Run a statement a worker sends over and over with the same text (the kept claim,
        the complete-many) on the Django connection ``conn``; return its rows (``fetch``)
        or its row count. ``constant``: its parameters are the same every time too;
        ``prepare``: the caller allows a prepared statement (:meth:`prepares` and no
        pooler in transaction mode: :func:`django_taskclaim.db.execute_kept`). Here,
        through Django's cursor; a vendor that can keep the statement prepared on the
        server overrides it (PostgreSQL, :meth:`PostgreSQL.execute_kept`)."""
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if fetch else int(cursor.rowcount)

    def prepares(self, conn: Any) -> bool:
        """Whether Django's connection ``conn`` may prepare statements (no vendor but
        PostgreSQL: :meth:`PostgreSQL.prepares`)."""
        return False

    def private_to_one_connection(self, settings_dict: Any) -> bool:
        """Whether a ``DATABASES`` entry names a database only one connection can see
        (SQLite in memory): no second thread or process may share its rows."""
        return False


def event_table(connection: Any) -> tuple[str, str]:
    """The ``taskclaim.TaskEvent`` table and its ``name`` column, quoted for
    ``connection`` (found in the app registry: the models sit above the backends)."""
    qn = connection.ops.quote_name
    meta = apps.get_model("taskclaim", "TaskEvent")._meta
    return qn(meta.db_table), qn(cast(Any, meta.get_field("name")).column)
