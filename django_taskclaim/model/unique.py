"""Unique enqueue: "insert this task unless an equal one is already ready or processing".

A model opts in with two declarations: an :class:`ActiveKeyField` (a stored generated
column that holds the row's key while the row is *active*, ``ready`` or ``processing``,
and ``NULL`` otherwise) and a plain ``UniqueConstraint`` on it. ``NULL`` never collides,
so the database refuses a second active row with the same key, and only that. Then
``Model.objects.enqueue_unique(dedupe_key=…, **fields)`` inserts, and on a violation of
*that* constraint returns the active row that holds the key (see :func:`insert_unique`).

The same declarations work on PostgreSQL, MariaDB / MySQL and SQLite: MariaDB has no
partial indexes (Django skips a conditional ``UniqueConstraint`` there with
``models.W036``), while a unique index on a stored generated column works everywhere.
See ``docs/unique.md``.

The system check registered here (tag ``taskclaim``, ``taskclaim.E030`` / ``E031``)
refuses a model with an :class:`ActiveKeyField` but no unique constraint on it, or whose
field no longer matches the model's status field and values.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.apps import apps
from django.core import checks
from django.db import IntegrityError, OperationalError, models, transaction
from django.db.models import Case, F, Q, When

from django_taskclaim.backends import for_alias, for_connection
from django_taskclaim.config.options import get_options
from django_taskclaim.config.settings import CHECK_TAG
from django_taskclaim.db import is_transient, retry_transient
from django_taskclaim.exceptions import ConfigurationError, TaskClaimError
from django_taskclaim.model.status import Status

logger = logging.getLogger("django_taskclaim.model.unique")

#: The logical states in which a row holds its key: a second row with the same key is
#: refused while one is in them. A retry puts a row back to ``ready``: still active.
ACTIVE_STATES = ("ready", "processing")

#: How many times :func:`insert_unique` inserts when the row holding the key keeps
#: finishing between its failed insert and its read.
INSERT_ATTEMPTS = 5


class UniqueKeyRaceError(TaskClaimError):
    """The row holding a key kept leaving the active states (or stayed invisible to this
    transaction) between a refused insert and the read of that row, every time."""


def _model_statuses(cls: type[models.Model]) -> tuple[str, list[Any]]:
    """``(status field name, stored values of the active states)`` from ``ClaimMeta``, as
    :func:`django_taskclaim.config.options.get_options` reads them (checked by E031)."""
    meta = getattr(cls, "ClaimMeta", None)
    status_field = getattr(meta, "status_field", "status")
    statuses = getattr(meta, "statuses", None) or {s: Status(s).value for s in ACTIVE_STATES}
    # A state left unmapped is reported by taskclaim.E002; the column stays valid meanwhile.
    return status_field, [statuses[s] for s in ACTIVE_STATES if statuses.get(s) is not None]


def active_key_expression(key_field: str, status_field: str, active_values: Sequence[Any]) -> Case:
    """``CASE WHEN <status> IN (<active values>) THEN <key> END``: the value an
    :class:`ActiveKeyField` stores (``NULL`` when the row is not active)."""
    return Case(When(Q(**{f"{status_field}__in": list(active_values)}), then=F(key_field)))


#: ``Field`` options that define a column's type (copied from the key field).
_TYPE_OPTIONS = ("max_length", "max_digits", "decimal_places", "db_collation")


class ActiveKeyField(models.GeneratedField):
    """A stored generated column: the row's ``key_field`` while its status is ``ready`` or
    ``processing``, ``NULL`` otherwise. Put a ``UniqueConstraint`` on it (check E030)::

        class Report(ClaimableModel):
            dedupe_key = models.CharField(max_length=200, null=True, blank=True)
            active_dedupe_key = ActiveKeyField("dedupe_key")

            class Meta(ClaimableModel.Meta):
                constraints = [
                    models.UniqueConstraint(
                        fields=["active_dedupe_key"], name="report_active_dedupe_key"
                    )
                ]

    The status field and its active values come from the model's ``ClaimMeta``
    (``status_field``, ``statuses``) unless given. ``output_field`` defaults to the key
    field's type, which must then be declared above this field. The database keeps the
    column current on every write, whoever writes; migrations record a plain
    ``GeneratedField``, so they do not import this class.
    """

    def __init__(
        self,
        key_field: str,
        output_field: models.Field[Any, Any] | None = None,
        *,
        status_field: str | None = None,
        active_values: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(key_field, str) or not key_field:
            raise TypeError(f"ActiveKeyField needs the name of the key field, got {key_field!r}")
        for name in ("expression", "db_persist", "unique", "primary_key"):
            if name in kwargs:
                raise TypeError(f"ActiveKeyField does not take {name}=")
        kwargs.setdefault("null", True)
        self.key_field = key_field
        self._status_field = status_field
        self._active_values = None if active_values is None else list(active_values)
        # Both are set in contribute_to_class, from the model this field joins.
        super().__init__(
            expression=cast(Any, None),
            output_field=cast(Any, output_field),
            db_persist=True,
            **kwargs,
        )

    def contribute_to_class(
        self, cls: type[models.Model], name: str, private_only: bool = False
    ) -> None:
        status_field, values = _model_statuses(cls)
        self.status_field = self._status_field or status_field
        self.active_values = self._active_values if self._active_values is not None else values
        self.expression = active_key_expression(
            self.key_field, self.status_field, self.active_values
        )
        if self.output_field is None:
            try:
                key = cls._meta.get_field(self.key_field)
            except Exception:
                raise TypeError(
                    f"{cls.__name__}.{name}: declare the key field {self.key_field!r} above "
                    "this ActiveKeyField, or pass output_field="
                ) from None
            if key.is_relation or not key.concrete:
                raise TypeError(
                    f"{cls.__name__}.{name}: the key field {self.key_field!r} must be a "
                    "plain column (not a relation); pass output_field= for a foreign key's id"
                )
            _, _, _, key_kwargs = key.deconstruct()
            options = {k: key_kwargs[k] for k in _TYPE_OPTIONS if k in key_kwargs}
            self.output_field = type(key)(**options)
        super().contribute_to_class(cls, name, private_only=private_only)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.GeneratedField", args, kwargs

    def clone(self) -> Any:
        """A plain ``GeneratedField`` with the same column (what migrations record)."""
        _name, _path, args, kwargs = self.deconstruct()
        return models.GeneratedField(*args, **kwargs)


@dataclass(frozen=True)
class UniqueKey:
    """A model's active key: the key field, its :class:`ActiveKeyField` and the unique
    constraint over it, with the names a violation reports."""

    model: type[models.Model]
    key_field: str
    field: str
    column: str
    constraint: str

    @property
    def table(self) -> str:
        return str(self.model._meta.db_table)


class SparseUniqueConstraint(models.UniqueConstraint):
    """A ``UniqueConstraint`` over one mostly-``NULL`` column (an :class:`ActiveKeyField`),
    indexed only where the column is set on the databases that have partial indexes.

    ``NULL`` never collides, so ``WHERE <column> IS NOT NULL`` changes nothing the
    constraint allows; it keeps the rows without a key (and every finished row) out of
    the index, so the writes of a claim and a completion do not each add an index entry
    for them. On PostgreSQL and SQLite that is a partial unique index; on MariaDB / MySQL
    (no partial indexes; ``NULL`` entries are cheap there) the plain unique constraint.
    Declared without a condition, it passes check E030 as a plain one does::

        constraints = [SparseUniqueConstraint(fields=["active_dedupe_key"], name="…")]
    """

    def _get_condition_sql(self, model: Any, schema_editor: Any) -> str | None:
        if self.condition is not None or len(self.fields) != 1:
            return super()._get_condition_sql(model, schema_editor)  # type: ignore[misc]
        if not schema_editor.connection.features.supports_partial_indexes:
            return None
        column = model._meta.get_field(self.fields[0]).column
        return f"{schema_editor.quote_name(column)} IS NOT NULL"


def active_key_fields(model: type[models.Model]) -> list[ActiveKeyField]:
    """The :class:`ActiveKeyField` s of ``model``."""
    return [f for f in model._meta.concrete_fields if isinstance(f, ActiveKeyField)]


def unique_constraint_on(model: type[models.Model], field: str) -> str | None:
    """The name of an unconditional ``UniqueConstraint`` over exactly ``field``, or
    ``None`` (a constraint with a condition is skipped on MariaDB / MySQL)."""
    for constraint in model._meta.constraints:
        if (
            isinstance(constraint, models.UniqueConstraint)
            and tuple(constraint.fields) == (field,)
            and constraint.condition is None
            and not constraint.expressions
            and constraint.deferrable is None
        ):
            return str(constraint.name)
    return None


def unique_key(model: type[models.Model], key_field: str | None = None) -> UniqueKey:
    """The :class:`UniqueKey` of ``model`` for ``key_field`` (may be left out when the
    model has one active key). Raises :class:`ConfigurationError` with the fix."""
    label = model._meta.label
    found = active_key_fields(model)
    if key_field is not None:
        found = [f for f in found if f.key_field == key_field]
    if not found:
        what = f"for {key_field!r} " if key_field is not None else ""
        raise ConfigurationError(
            f"{label} has no ActiveKeyField {what}to enqueue uniquely by; add "
            "ActiveKeyField('<key field>') and a UniqueConstraint on it (docs/unique.md)"
        )
    if len(found) > 1:
        names = ", ".join(sorted(f.key_field for f in found))
        raise ConfigurationError(f"{label} has several active keys ({names}): pass key_field=")
    field = found[0]
    constraint = unique_constraint_on(model, field.name)
    if constraint is None:
        raise ConfigurationError(
            f"{label}.{field.name} has no UniqueConstraint(fields=[{field.name!r}]) without "
            "a condition: nothing would stop a duplicate (system check taskclaim.E030)"
        )
    return UniqueKey(model, field.key_field, field.name, str(field.column), constraint)


def is_unique_violation(exc: BaseException, key: UniqueKey, using: str) -> bool:
    """Whether ``exc`` is a violation of ``key``'s unique constraint and of nothing else
    (the vendor's error codes, in :mod:`django_taskclaim.backends`)."""
    if not isinstance(exc, IntegrityError):
        return False
    return for_alias(using).is_unique_violation(
        exc.__cause__ or exc, table=key.table, constraint=key.constraint, columns=[key.column]
    )


#: Longest time, in seconds, a caller inside a transaction on MySQL / MariaDB tries its
#: insert again while another transaction's uncommitted row of the same key is pending.
KEY_WAIT_TIMEOUT = 10.0


@contextlib.contextmanager
def _key_turn(conn: Any, key: UniqueKey, value: Any) -> Iterator[None]:
    """One caller at a time tries to insert (``key``, ``value``) inside a transaction on
    MySQL / MariaDB: a named lock (``GET_LOCK``, the session's, not a row lock) held
    around the caller's attempts. Two callers that each hold the share locks of a
    refused duplicate check would otherwise each wait for the other's commit, for ever;
    taken in turn, the second one waits only for the first one's transaction."""
    from django_taskclaim.locks.keys import normalize_key  # deferred: the locks import the models

    sql = for_connection(conn)
    name = f"taskclaim-unique:{key.table}:{key.constraint}:{value!r}"
    lock_id = sql.advisory_lock_id(normalize_key(name), str(conn.settings_dict["NAME"]))
    lock = sql.advisory_lock(
        lock_id, xact=False, shared=False, try_=False, timeout=KEY_WAIT_TIMEOUT
    )
    with conn.cursor() as cursor:
        cursor.execute(*lock)
        (got,) = cursor.fetchone()
    if not sql.advisory_acquired(got, lock_id, try_=False):
        raise UniqueKeyRaceError(
            f"enqueue_unique() on {key.model._meta.label}: another transaction kept its "
            f"turn to insert {key.key_field}={value!r} for over {KEY_WAIT_TIMEOUT:g} s"
        )
    try:
        yield
    finally:
        raw = conn.connection.cursor()  # the caller's block may refuse statements now
        try:
            raw.execute(*sql.advisory_unlock(lock_id, shared=False))
        finally:
            raw.close()


def _insert_without_lock_waits(conn: Any, save: Callable[[], None]) -> None:
    """``save()`` with the session's row-lock wait set to none (MySQL / MariaDB) and then
    restored. InnoDB checks a duplicate by share-locking the index records equal to the
    key (a finished row's delete-marked one and its gap included); two transactions
    holding such locks and each waiting for the other deadlock, and the victim's whole
    transaction is rolled back: nothing a savepoint could retry. An insert that never
    waits never closes such a cycle; its lock wait timeout (error 1205) rolls back only
    the statement, and the caller reads and tries again."""
    sql = for_connection(conn)
    with conn.cursor() as cursor:
        cursor.execute(*sql.get_lock_timeout())
        (previous,) = cursor.fetchone()
        cursor.execute(*sql.set_lock_timeout("0ms"))
    try:
        save()
    finally:
        raw = conn.connection.cursor()  # the caller's block may refuse statements now
        try:
            raw.execute(*sql.set_lock_timeout(str(previous)))
        finally:
            raw.close()


def insert_unique[M: models.Model](
    build: Callable[[], M], *, using: str, key_field: str | None = None
) -> tuple[M, bool]:
    """Insert the row ``build()`` returns unless an active row has the same key; return
    ``(row, created)``.

    Guarantees: the INSERT itself decides (the unique constraint over the
    :class:`ActiveKeyField`), so however many connections race on one key, exactly one
    active row holds it and every caller gets that row. ``created`` is ``False`` when
    another active row held the key: that row is returned, nothing is written. Any other
    ``IntegrityError`` (another constraint, a NOT NULL column) is raised unchanged.
    Inside the caller's ``transaction.atomic()`` the insert runs in a savepoint: it
    commits or rolls back with the caller, and a refused insert leaves the caller's
    transaction usable (outside one it is a single autocommit INSERT). There a racing
    caller waits for the first one's commit, then gets the committed row (on MySQL /
    MariaDB its insert never waits on a row lock, so InnoDB's duplicate checks cannot
    deadlock it: it reads and tries again instead, for up to :data:`KEY_WAIT_TIMEOUT`
    seconds). An active row this transaction can already see is returned without an
    insert. If the holder
    leaves the active states between the refused insert and the read, the insert is
    tried again, up to :data:`INSERT_ATTEMPTS` times, then :class:`UniqueKeyRaceError`.
    A row with a ``NULL`` key is refused (``ValueError``).
    """
    first = build()
    model = type(first)
    key = unique_key(model, key_field)
    value = getattr(first, key.key_field)
    if value is None:
        raise ValueError(
            f"enqueue_unique() on {model._meta.label} needs a value for {key.key_field!r}: "
            "a row without a key is never a duplicate"
        )
    base = model._base_manager.using(using)
    conn = transaction.get_connection(using)
    in_atomic = conn.in_atomic_block
    no_waits = in_atomic and for_connection(conn).duplicate_checks_deadlock
    turn = _key_turn(conn, key, value) if no_waits else contextlib.nullcontext()
    with turn:
        return _insert_or_read(build, first, key, value, using, base, in_atomic, no_waits)


def _insert_or_read[M: models.Model](
    build: Callable[[], M],
    first: M,
    key: UniqueKey,
    value: Any,
    using: str,
    base: Any,
    in_atomic: bool,
    no_waits: bool,
) -> tuple[M, bool]:
    """The attempts of :func:`insert_unique`: read (inside a transaction), insert, and on
    a refused insert read the holder."""
    model = type(first)
    conn = transaction.get_connection(using)
    waited_until = time.monotonic() + KEY_WAIT_TIMEOUT
    pause = 0.002
    row: M | None = first
    attempt = 0
    while attempt < INSERT_ATTEMPTS:
        attempt += 1
        if in_atomic:
            # A plain read, no lock: a row already visible (this transaction's own, or
            # committed) is the answer, and no insert is sent to wait on anything.
            seen = base.filter(**{key.field: value}).first()
            if seen is not None:
                return seen, False
        new = row if row is not None else build()
        row = None

        def insert(new: M = new) -> None:
            if not in_atomic:
                new.save(using=using, force_insert=True)  # autocommit: one round trip
                return
            with transaction.atomic(using=using):  # a savepoint in the caller's block
                if no_waits:
                    _insert_without_lock_waits(
                        conn, lambda: new.save(using=using, force_insert=True)
                    )
                else:
                    new.save(using=using, force_insert=True)

        try:
            retry_transient(insert, using, what=f"enqueue {model._meta.label} uniquely")
        except IntegrityError as exc:
            if not is_unique_violation(exc, key, using):
                raise
        except OperationalError as exc:
            if not no_waits or not is_transient(exc, using):
                raise
            if time.monotonic() > waited_until:
                raise UniqueKeyRaceError(
                    f"enqueue_unique() on {model._meta.label}: another transaction's "
                    f"locks on {key.key_field}={value!r} stayed for over "
                    f"{KEY_WAIT_TIMEOUT:g} s"
                ) from exc
            # Another transaction's row lock (an uncommitted row of this key, a row
            # finishing): read again after a pause, as a waiting insert would.
            row, attempt = new, attempt - 1
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(0.05, pause * 2)
            continue
        else:
            return new, True
        holder = base.filter(**{key.field: value}).first()
        if holder is not None:
            return holder, False
        logger.debug(
            "unique key released before read model=%s key=%r attempt=%s",
            model._meta.label,
            value,
            attempt,
        )
    raise UniqueKeyRaceError(
        f"enqueue_unique() on {model._meta.label}: the row holding {key.key_field}={value!r} "
        f"was refused {INSERT_ATTEMPTS} times but could not be read (it kept finishing, or "
        "this transaction's isolation level hides it: use READ COMMITTED)"
    )


# -- system check ---------------------------------------------------------------------


def check_model(model: type[models.Model]) -> list[checks.CheckMessage]:
    """The E030 / E031 findings for one model (see :func:`check_unique_keys`)."""
    errors: list[checks.CheckMessage] = []
    for field in active_key_fields(model):
        where = f"{model._meta.label}.{field.name}"
        if unique_constraint_on(model, field.name) is None:
            errors.append(
                checks.Error(
                    f"{where} is an ActiveKeyField without a unique constraint: duplicate "
                    "active rows would not be refused.",
                    hint=f"Add models.UniqueConstraint(fields=[{field.name!r}], name=...) to "
                    f"{model.__name__}.Meta.constraints (no condition), then makemigrations.",
                    obj=model,
                    id="taskclaim.E030",
                )
            )
        try:
            opts = get_options(model)
        except ConfigurationError:
            continue  # taskclaim.E002 reports it
        expected = [opts.value(s) for s in ACTIVE_STATES]
        problems = []
        if field.status_field != opts.status_field:
            problems.append(
                f"it reads status field {field.status_field!r}, the model's is "
                f"{opts.status_field!r}"
            )
        elif list(field.active_values) != expected:
            problems.append(
                f"it treats {field.active_values!r} as active, the model's ready and "
                f"processing values are {expected!r}"
            )
        names = {f.name for f in model._meta.concrete_fields}
        if field.key_field not in names:
            problems.append(f"the model has no field {field.key_field!r}")
        for problem in problems:
            errors.append(
                checks.Error(
                    f"{where} does not match the model: {problem}.",
                    hint="Let ActiveKeyField read ClaimMeta (drop status_field= / "
                    "active_values=) or fix them, then makemigrations.",
                    obj=model,
                    id="taskclaim.E031",
                )
            )
    return errors


def _models(app_configs: Iterable[Any] | None) -> Iterable[type[models.Model]]:
    if app_configs is None:
        return apps.get_models()
    return (m for config in app_configs for m in config.get_models())


@checks.register(CHECK_TAG)
def check_unique_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E030: an :class:`ActiveKeyField` has no unconditional unique constraint; E031: its
    status field or active values differ from the model's claim options, or its key field
    is missing. Registered when this module is imported (by every model that uses it)."""
    errors: list[checks.CheckMessage] = []
    for model in _models(app_configs):
        if not model._meta.abstract and not model._meta.proxy:
            errors.extend(check_model(model))
    return errors
