"""Dependencies between rows: what ``after=`` records at enqueue, and the release of a
row's dependents in the transaction of its final settle. See docs/workflows.md.

The one home of the rule "a row waits until its prerequisites settle":

- :func:`plan_after` (enqueue, inside the producer's transaction): checks ``after=``,
  reads the prerequisite rows (no lock), and says in which state the new rows start
  (``ready``, ``waiting``, or ``cancelled`` when a prerequisite already failed and the
  policy is ``cancel``) and which edges to write; :func:`write_edges` writes them, and
  :func:`seal_after`, the last step before the commit, locks the prerequisites read
  unsettled and settles the new edges of those that settled meanwhile.
- :func:`release_dependents` (every final settle of a model declaring
  ``ClaimMeta.dependents``, inside that settle's transaction): closes the settled rows'
  open edges and, under a row lock on each dependent, releases the dependent whose last
  edge it closed (``waiting`` → ``ready``, the workers woken after the commit) or applies
  its policy to a failed prerequisite; a cancelled dependent's own dependents follow. A
  dependent whose unique key another active row holds is skipped as a duplicate
  (``cancelled``) instead of released: the settle never fails on a dependent's key.
- :func:`settle_and_release` is how a settle path wraps its write and the release in one
  transaction (retried whole on a deadlock), or runs the write alone for a model whose
  rows nobody may wait for.

Why a lock on the dependent's fan-in counter (``TaskFanIn``, one row per dependent):
two prerequisites settling at once in two transactions each lock the counter before
they close their edges and decrement it, so the second sees the first's decrement
(never both "one still open": stuck; never both "none open": released twice). The
counter's read is a locking read and the edges are closed by a conditional ``UPDATE``,
so MariaDB's repeatable-read snapshot cannot hide the other's write. Only the edges
being closed and the counter are read: a settle costs the same whatever the number of
the dependent's other prerequisites (a fan-in of 100,000).

Why the enqueue locks its prerequisites last (:func:`seal_after`), not first: a
prerequisite's settle must either come before the enqueue reads its state (the enqueue
then sees it final) or find the enqueue's edges (committed). The settle's ``UPDATE`` of
the prerequisite and the enqueue's locking read conflict (``FOR UPDATE``; PostgreSQL's
weaker ``FOR SHARE`` conflicts with that ``UPDATE`` just the same, and ``FOR KEY
SHARE`` not at all, so no weaker lock would shorten the wait), so one of them waits for
the other's commit. Taken at the start, that lock made a settle wait for the whole
enqueue (rows, edges and counters written: 27 s for 100,000 prerequisites); taken at the
end, a settle waits at most for the seal (one locking read per :data:`CHUNK`
prerequisites still unsettled, the edges of those that settled meanwhile closed, the
commit). A settle that committed before the seal's read is seen by it; one that comes
after waits for the commit and then finds the edges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import IntegrityError, models, transaction

from django_taskclaim.claim.resets import Change, writes
from django_taskclaim.config.discovery import is_claimable
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.db import DbNow, retry_transient
from django_taskclaim.exceptions import DependencyError
from django_taskclaim.model.unique import UniqueKey, active_key_fields, unique_constraint_on
from django_taskclaim.model.unique_insert import is_unique_violation
from django_taskclaim.row.status import TERMINAL_STATES
from django_taskclaim.wakeup.notify import notify

#: A dependent's policy when a prerequisite ends ``failed`` or ``cancelled``.
POLICIES = ("cancel", "run", "hold")
#: The ``outcome`` of an open edge.
OPEN = ""
#: The edge table's model and the fan-in counters' model, found through the app
#: registry: they sit above this layer (docs/architecture.md).
EDGE_MODEL = "taskclaim.TaskDependency"
FAN_IN_MODEL = "taskclaim.TaskFanIn"
#: Rows per statement when ``after=`` reads or writes many prerequisites (SQLite binds
#: at most 32,766 parameters; PostgreSQL 65,535).
CHUNK = 500
#: The longest primary key text an edge stores (its column's length).
KEY_LENGTH = 191


def _edges(using: str) -> models.QuerySet:
    return apps.get_model(EDGE_MODEL)._base_manager.using(using)


def _fan_ins(using: str) -> models.QuerySet:
    return apps.get_model(FAN_IN_MODEL)._base_manager.using(using)


def label_of(model: type[models.Model]) -> str:
    """The label an edge names a model by (a proxy's concrete model)."""
    return str((model._meta.concrete_model or model)._meta.label)


def key_of(pk: Any) -> str:
    """A primary key as the edge table stores it."""
    return str(pk)


def _pk(model: type[models.Model], key: str) -> Any:
    return model._meta.pk.to_python(key)


@dataclass
class Plan:
    """How new dependent rows start: ``state`` (``ready``, ``waiting`` or ``cancelled``),
    the ``error`` text their ``last_error`` gets (or ``None``), and the edges to write
    (prerequisite label, key, outcome: ``""`` while open)."""

    state: str
    error: str | None
    policy: str
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    #: The prerequisites read unsettled, per model: :func:`seal_after` locks them.
    unsettled: dict[type[models.Model], list[Any]] = field(default_factory=dict)

    def apply(self, opts: ClaimOptions, obj: models.Model) -> None:
        """Set ``obj`` (unsaved) to start as planned."""
        status_attname = obj._meta.get_field(opts.status_field).attname  # type: ignore[union-attr]
        setattr(obj, status_attname, opts.value(self.state))
        change = {"cancelled": Change.PREREQUISITE_FAILED, "waiting": Change.HOLD}.get(self.state)
        if change is not None and self.error is not None:
            for name, value in writes(opts, change, error=self.error).items():
                setattr(obj, name, value)


def _why(label: str, key: str, state: str, error: str, policy: str) -> str:
    first = error.strip().splitlines()[0][:200] if error.strip() else ""
    text = f"prerequisite {label} #{key} ended {state}" + (f" ({first})" if first else "")
    if policy == "hold":
        return text + (
            "; held for an operator (on_failure='hold'): requeue the prerequisite, "
            "or cancel this row"
        )
    return text + "; cancelled (on_failure='cancel')"


def _check(
    model: type[models.Model], after: Any, using: str, policy: str, rows: Sequence[Any]
) -> list[models.Model]:
    opts = get_options(model)
    if policy not in POLICIES:
        raise DependencyError(
            f"{opts.label}: on_failure must be one of {', '.join(POLICIES)}, got {policy!r}"
        )
    if opts.statuses.get("waiting") is None:
        raise DependencyError(
            f"{opts.label} maps no 'waiting' status (ClaimMeta.statuses), so its rows cannot "
            "wait for others; map one to use after="
        )
    if policy == "cancel" and opts.statuses.get("cancelled") is None:
        raise DependencyError(
            f"{opts.label} maps no 'cancelled' status: use on_failure='run' or 'hold'"
        )
    if isinstance(after, (models.Model, str, bytes)) or not isinstance(after, Iterable):
        raise DependencyError(f"{opts.label}: after= takes a list of saved rows")
    found: list[models.Model] = []
    for row in after:
        if not isinstance(row, models.Model):
            raise DependencyError(f"{opts.label}: after= holds {row!r}, not a saved row")
        if any(row is r for r in rows):
            raise DependencyError(f"{opts.label}: a row cannot wait for itself (after=)")
        if row._state.adding or row.pk is None:
            raise DependencyError(
                f"{opts.label}: after= holds an unsaved {type(row)._meta.label}; save it first "
                "(a row can only wait for rows that exist, so no cycle can be made)"
            )
        label = label_of(type(row))
        if not is_claimable(type(row)) or not get_options(type(row)).dependents:
            raise DependencyError(
                f"{opts.label}: after= holds a {label} row; set ClaimMeta.dependents = True "
                f"on {label} so its settles release the rows that wait for it"
            )
        if (row._state.db or "default") != using:
            raise DependencyError(
                f"{opts.label}: after= holds a {label} row of database "
                f"{row._state.db!r}; dependents are written to {using!r}"
            )
        if len(key_of(row.pk)) > KEY_LENGTH:
            raise DependencyError(f"{label} pk {row.pk!r} is longer than {KEY_LENGTH} characters")
        found.append(row)
    return found


def plan_after(
    model: type[models.Model],
    after: Any,
    using: str,
    *,
    on_failure: str = "cancel",
    rows: Sequence[Any] = (),
) -> Plan:
    """Check ``after=`` for new rows of ``model`` (``rows``, unsaved) and say how they
    start. Run inside the transaction that inserts them; the prerequisites are read
    without a lock: :func:`seal_after`, called after the edges are written, locks those
    read unsettled until the commit, so a prerequisite's settle either comes before
    (the seal reads its final state) or after (it finds the edges). Raises
    :class:`~django_taskclaim.exceptions.DependencyError` before anything is written."""
    prereqs = _check(model, after, using, on_failure, rows)
    by_model: dict[type[models.Model], set[Any]] = {}
    for row in prereqs:
        by_model.setdefault(type(row)._meta.concrete_model or type(row), set()).add(row.pk)
    plan = Plan(state="ready", error=None, policy=on_failure)
    for pmodel in sorted(by_model, key=lambda m: m._meta.label):
        popts = get_options(pmodel)
        fields = [popts.status_field] + (["last_error"] if popts.has("last_error") else [])
        wanted = sorted(by_model[pmodel], key=key_of)
        found: dict[str, list[Any]] = {}
        for i in range(0, len(wanted), CHUNK):
            found.update(
                (key_of(pk), rest)
                for pk, *rest in pmodel._base_manager.using(using)
                .filter(pk__in=wanted[i : i + CHUNK])
                .values_list("pk", *fields)
            )
        for pk in wanted:
            key = key_of(pk)
            if key not in found:
                raise DependencyError(f"after=: {popts.label} #{key} does not exist (deleted?)")
            state = popts.state_of(found[key][0]) or "unknown"
            error = str(found[key][1] or "") if len(found[key]) > 1 else ""
            plan.edges.append(_edge_of(plan, label_of(pmodel), key, state, error))
            if state not in TERMINAL_STATES:
                plan.unsettled.setdefault(pmodel, []).append(pk)
    if plan.state == "ready" and any(o == OPEN for _, _, o in plan.edges):
        plan.state = "waiting"
    return plan


def _edge_of(plan: Plan, label: str, key: str, state: str, error: str) -> tuple[str, str, str]:
    if state == "done":
        return label, key, "done"
    if state not in ("failed", "cancelled"):
        return label, key, OPEN
    if plan.policy == "run":
        return label, key, state
    plan.error = plan.error or _why(label, key, state, error, plan.policy)
    if plan.policy == "hold":
        return label, key, OPEN
    plan.state = "cancelled"
    return label, key, state


def write_edges(plan: Plan, model: type[models.Model], objs: Iterable[Any], using: str) -> None:
    """Write the edges of ``plan`` for the saved rows ``objs`` of ``model``, and each
    row's fan-in counter (how many edges are open, how the others ended)."""
    edge = apps.get_model(EDGE_MODEL)
    fan_in = apps.get_model(FAN_IN_MODEL)
    label = label_of(model)
    ended = [outcome for _, _, outcome in plan.edges]
    counts = {state: ended.count(state) for state in ("done", "failed", "cancelled")}
    out = []
    counters = []
    for obj in objs:
        if obj.pk is None:  # MySQL's bulk insert returns no keys
            raise DependencyError(
                f"{label}: the database returned no primary keys for the new rows; "
                "enqueue them one by one with create(after=...)"
            )
        for plabel, pkey, outcome in plan.edges:
            out.append(
                edge(
                    prerequisite_model=plabel,
                    prerequisite_pk=pkey,
                    dependent_model=label,
                    dependent_pk=key_of(obj.pk),
                    on_failure=plan.policy,
                    outcome=outcome,
                    settled_at=None if outcome == OPEN else DbNow(),
                )
            )
        counters.append(
            fan_in(
                dependent_model=label,
                dependent_pk=key_of(obj.pk),
                on_failure=plan.policy,
                total=len(ended),
                open=ended.count(OPEN),
                released_at=DbNow() if plan.state == "ready" else None,
                **counts,
            )
        )
    edge._base_manager.using(using).bulk_create(out, batch_size=CHUNK)
    fan_in._base_manager.using(using).bulk_create(counters, batch_size=CHUNK)


def seal_after(plan: Plan, model: type[models.Model], objs: Iterable[Any], using: str) -> None:
    """The last step of an enqueue ``after=``, just before its commit, once the rows
    ``objs`` of ``model`` and their edges (:func:`write_edges`) are written: lock the
    prerequisites :func:`plan_after` read unsettled (``FOR UPDATE``, :data:`CHUNK` at a
    time, in key order) and settle the new rows' edges from those that reached a final
    state since, as their settle would have (:func:`_settle_edges`: the counter, the
    release or the policy). Their settles committed before this read and could not see
    the edges; a settle that comes after waits for this commit and finds them. The
    locks are held from here to the commit only, so a settle waits for the seal, not
    for the whole enqueue."""
    keys = [key_of(obj.pk) for obj in objs]
    label = label_of(model)
    changed = False
    for pmodel in sorted(plan.unsettled, key=lambda m: m._meta.label):
        popts = get_options(pmodel)
        fields = [popts.status_field] + (["last_error"] if popts.has("last_error") else [])
        wanted = sorted(plan.unsettled[pmodel], key=key_of)
        settled: dict[str, list[str]] = {}
        errors: dict[str, str] = {}
        seen = 0
        for i in range(0, len(wanted), CHUNK):
            for pk, status, *rest in (
                pmodel._base_manager.using(using)
                .select_for_update()
                .filter(pk__in=wanted[i : i + CHUNK])
                .order_by("pk")
                .values_list("pk", *fields)
            ):
                seen += 1
                state = popts.state_of(status)
                if state in TERMINAL_STATES:
                    settled.setdefault(str(state), []).append(key_of(pk))
                    errors[key_of(pk)] = str(rest[0] or "") if rest else ""
        if seen != len(wanted):
            raise DependencyError(f"after=: a {popts.label} prerequisite was deleted meanwhile")
        plabel = label_of(pmodel)
        for state in sorted(settled):
            for dkey in keys:
                _settle_edges(plabel, set(settled[state]), state, label, dkey, using, errors)
            changed = True
    if changed:  # the instances say what the rows now are (released, cancelled, held)
        _refresh(model, list(objs), using)


def _refresh(model: type[models.Model], objs: list[Any], using: str) -> None:
    names = [f.attname for f in model._meta.concrete_fields if not f.primary_key]
    for i in range(0, len(objs), CHUNK):
        part = objs[i : i + CHUNK]
        now = model._base_manager.using(using).in_bulk([obj.pk for obj in part])
        for obj in part:
            for name in names:
                setattr(obj, name, getattr(now[obj.pk], name))


def settle_and_release[T](
    model: type[models.Model],
    using: str,
    write: Callable[[], T],
    settled: Callable[[T], tuple[list[Any], str]],
    *,
    what: str,
) -> T:
    """Run ``write`` (a settle of ``model``'s rows) and release the dependents of the
    rows it settled (``settled(result)``: their primary keys and final state) in one
    transaction, retried whole on a deadlock. For a model that does not declare
    ``ClaimMeta.dependents``, ``write`` alone, retried as before: nothing more."""
    if not get_options(model).dependents:
        return retry_transient(write, using, what=what)

    def both() -> T:
        with transaction.atomic(using=using):
            result = write()
            pks, state = settled(result)
            release_dependents(model, pks, state, using)
            return result

    return retry_transient(both, using, what=what)


def release_dependents(
    model: type[models.Model], pks: Iterable[Any], state: str, using: str
) -> None:
    """The rows ``pks`` of ``model`` reached the final ``state``: close their open edges
    and release or settle their dependents. Call it inside the settle's transaction
    (:func:`settle_and_release`); nothing is done for a model that does not declare
    ``ClaimMeta.dependents`` or a state that is not final."""
    opts = get_options(model)
    keys = [key_of(pk) for pk in pks]
    if not opts.dependents or not keys or state not in TERMINAL_STATES:
        return
    work = [(label_of(model), keys, state)]
    while work:
        label, keys, state = work.pop()
        for dlabel, dkey in _dependents_of(label, keys, using):
            ended = _settle_edges(label, set(keys), state, dlabel, dkey, using)
            if ended is not None:
                work.append((dlabel, [dkey], ended))


def _dependents_of(label: str, keys: list[str], using: str) -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for i in range(0, len(keys), CHUNK):
        found.update(
            _edges(using)
            .filter(prerequisite_model=label, prerequisite_pk__in=keys[i : i + CHUNK], outcome=OPEN)
            .values_list("dependent_model", "dependent_pk")
        )
    return sorted(found)  # one lock order: no deadlock between two settles


def _settle_edges(
    label: str,
    keys: set[str],
    state: str,
    dlabel: str,
    dkey: str,
    using: str,
    errors: dict[str, str] | None = None,
) -> str | None:
    """Settle the open edges from ``label`` ``keys`` to one dependent, under the lock of
    its fan-in counter; return the final state the dependent was moved to, if any and if
    its model declares ``dependents`` (its own dependents follow), else ``None``. What is
    read and written is the counter row, the edges being closed and the dependent's row,
    never the dependent's other edges: the same cost for ten prerequisites or 100,000.
    The dependent's writes are conditional on its being ``waiting`` (an operator may
    have cancelled it meanwhile). ``errors``: the prerequisites' ``last_error`` when the
    caller read them already (the seal)."""

    def error_of(key: str) -> str:
        if errors is not None and key in errors:
            return errors[key]
        return _prerequisite_error(label, key, using)

    dmodel = apps.get_model(dlabel)
    dopts = get_options(dmodel)
    mine = _edges(using).filter(
        dependent_model=dlabel,
        dependent_pk=dkey,
        prerequisite_model=label,
        prerequisite_pk__in=sorted(keys),
        outcome=OPEN,
    )
    counter = (
        _fan_ins(using)
        .select_for_update()
        .filter(dependent_model=dlabel, dependent_pk=dkey)
        .values_list("pk", "open", "on_failure")
        .first()
    )
    if counter is None:  # its counter deleted by hand: count the open edges instead
        policy = mine.values_list("on_failure", flat=True).first()
        if policy is None:
            return None
        still = _edges(using).filter(dependent_model=dlabel, dependent_pk=dkey, outcome=OPEN)
        counter = (None, still.count(), policy)
    policy = counter[2]
    waiting = dmodel._base_manager.using(using).filter(
        dopts.status_q("waiting"), pk=_pk(dmodel, dkey)
    )
    if state != "done" and policy == "hold":
        key = mine.values_list("prerequisite_pk", flat=True).first()
        if key is not None:  # held: the edge stays open, the row says why
            text = _why(label, key, state, error_of(key), policy)
            waiting.update(**writes(dopts, Change.HOLD, error=text))
        return None
    closed = mine.update(outcome=state, settled_at=DbNow())
    if not closed:
        return None  # closed by another settle that came first
    released = False
    ended: str | None = None
    if state == "done" or policy == "run":
        if counter[1] - closed <= 0:
            released, ended = _release(dmodel, dkey, waiting, using)
            if released:
                notify(dmodel, using=using)  # after the commit, as for a new row
    else:
        key = str(
            _edges(using)
            .filter(
                dependent_model=dlabel,
                dependent_pk=dkey,
                prerequisite_model=label,
                prerequisite_pk__in=sorted(keys),
                outcome=state,
            )
            .values_list("prerequisite_pk", flat=True)
            .first()
        )
        text = _why(label, key, state, error_of(key), policy)
        cancelled = waiting.update(
            **{
                dopts.status_field: dopts.value("cancelled"),
                "version": models.F("version") + 1,
            },
            **writes(dopts, Change.PREREQUISITE_FAILED, error=text),
        )
        ended = "cancelled" if cancelled else None
    if counter[0] is not None:
        _fan_ins(using).filter(pk=counter[0]).update(
            open=models.F("open") - closed,
            **{state: models.F(state) + closed},
            **({"released_at": DbNow()} if released else {}),
        )
    return ended if dopts.dependents else None


def _release(
    dmodel: type[models.Model], dkey: str, waiting: models.QuerySet, using: str
) -> tuple[bool, str | None]:
    """``waiting`` → ``ready`` for the dependent ``dkey`` whose last edge just closed;
    return whether it was released, and the final state it was moved to instead.
    Releasing a row makes its unique keys active (docs/unique.md); where another active
    row holds one, the database refuses the release, and the row is skipped as a
    duplicate instead: ``cancelled`` (``failed`` for a model that maps no ``cancelled``
    state), the text naming the key and its holder. The refused ``UPDATE`` is the
    arbiter, as the refused ``INSERT`` is for ``enqueue_unique()``: an enqueue of the key
    still uncommitted is waited for, then decides. It runs in a savepoint, so the settle
    it is part of goes on; a model without active keys pays for none."""
    dopts = get_options(dmodel)
    ready = {dopts.status_field: dopts.value("ready"), "version": models.F("version") + 1}
    keys = _unique_keys(dmodel)
    if not keys:
        return bool(waiting.update(**ready, **writes(dopts, Change.UNBLOCK))), None
    try:
        with transaction.atomic(using=using):
            return bool(waiting.update(**ready, **writes(dopts, Change.UNBLOCK))), None
    except IntegrityError as exc:
        key = next((k for k in keys if is_unique_violation(exc, k, using)), None)
        if key is None:
            raise
    ended = "cancelled" if dopts.statuses.get("cancelled") is not None else "failed"
    text = _duplicate(dmodel, dkey, key, using)
    skipped = waiting.update(
        **{dopts.status_field: dopts.value(ended), "version": models.F("version") + 1},
        **writes(dopts, Change.DUPLICATE, error=text),
    )
    return False, ended if skipped else None


def _unique_keys(model: type[models.Model]) -> list[UniqueKey]:
    """The active keys of ``model`` that a unique constraint enforces."""
    found = []
    for active in active_key_fields(model):
        constraint = unique_constraint_on(model, active.name)
        if constraint is not None:
            found.append(
                UniqueKey(model, active.key_field, active.name, str(active.column), constraint)
            )
    return found


def _duplicate(dmodel: type[models.Model], dkey: str, key: UniqueKey, using: str) -> str:
    """Why the dependent ``dkey`` was skipped: its key, and the active row holding it
    (two indexed reads, on this path only)."""
    rows = dmodel._base_manager.using(using)
    pk = _pk(dmodel, dkey)
    value = rows.filter(pk=pk).values_list(key.key_field, flat=True).first()
    holder = rows.filter(**{key.field: value}).exclude(pk=pk).values_list("pk", flat=True).first()
    who = "" if holder is None else f" ({label_of(dmodel)} #{key_of(holder)})"
    return (
        f"skipped as a duplicate: its key {key.key_field} {value!r} was held by another "
        f"active row{who} when its prerequisites finished"
    )


def _prerequisite_error(label: str, key: str, using: str) -> str:
    model = apps.get_model(label)
    if not get_options(model).has("last_error"):
        return ""
    rows = model._base_manager.using(using).filter(pk=_pk(model, key))
    return str(rows.values_list("last_error", flat=True).first() or "")


def open_prerequisites(obj: models.Model, limit: int | None = None) -> list[tuple[str, str]]:
    """The prerequisites ``obj`` still waits for: (model label, primary key text), the
    oldest first; at most ``limit`` of them."""
    found = prerequisites(obj, OPEN).values_list("prerequisite_model", "prerequisite_pk")
    return list(found if limit is None else found[:limit])


@dataclass(frozen=True)
class FanIn:
    """Where a dependent row stands: of its ``total`` prerequisites, ``open`` still
    unsettled (or held by ``on_failure='hold'``), and how many ended ``done``,
    ``failed`` and ``cancelled``; ``released`` once its last prerequisite settled made it
    ``ready`` (not when that cancelled it, or skipped it as a duplicate of its key)."""

    total: int
    open: int
    done: int
    failed: int
    cancelled: int
    released: bool


def fan_in(obj: models.Model) -> FanIn | None:
    """The fan-in counter of ``obj`` (one indexed read, whatever the number of its
    prerequisites), or ``None`` for a row that waits for nothing. A callback row reads
    its members' outcomes here; :func:`prerequisites` lists them one by one."""
    using = obj._state.db or "default"
    row = (
        _fan_ins(using)
        .filter(dependent_model=label_of(type(obj)), dependent_pk=key_of(obj.pk))
        .values_list("total", "open", "done", "failed", "cancelled", "released_at")
        .first()
    )
    if row is None:
        return None
    total, open_, done, failed, cancelled, released_at = row
    return FanIn(total, open_, done, failed, cancelled, released=released_at is not None)


def prerequisites(obj: models.Model, outcome: str | None = None) -> models.QuerySet:
    """The edges of ``obj`` (``TaskDependency`` rows, oldest first): every prerequisite
    with its ``outcome`` (``""`` while open), or only those with ``outcome``."""
    using = obj._state.db or "default"
    edges = _edges(using).filter(dependent_model=label_of(type(obj)), dependent_pk=key_of(obj.pk))
    if outcome is not None:
        edges = edges.filter(outcome=outcome)
    return edges.order_by("pk")


def dependents(obj: models.Model, outcome: str | None = None) -> models.QuerySet:
    """The edges to the rows that wait (or waited) for ``obj`` (``TaskDependency`` rows,
    oldest first), read through the prerequisite index; with ``outcome``, only those
    (``""``: still waiting for it)."""
    using = obj._state.db or "default"
    edges = _edges(using).filter(
        prerequisite_model=label_of(type(obj)), prerequisite_pk=key_of(obj.pk)
    )
    if outcome is not None:
        edges = edges.filter(outcome=outcome)
    return edges.order_by("pk")


#: A waiting row held for an operator (``on_failure='hold'``): its reason starts so.
HELD = "held"


def stuck_dependents(
    model: type[models.Model], using: str, *, limit: int = 1000
) -> list[tuple[Any, str]]:
    """Waiting rows of ``model`` that no settle will release, among the first ``limit``
    (oldest primary keys first), each with why: it waits for nothing (every edge
    closed, yet still ``waiting``), or an open edge's prerequisite is gone (deleted by
    hand) or already final (written outside the library, so its settle never closed the
    edge). Rows held for an operator (``on_failure='hold'`` after a failure) are
    reported too, their reason starting with :data:`HELD`. Only reads."""
    opts = get_options(model)
    if opts.statuses.get("waiting") is None:
        return []
    label = label_of(model)
    rows = model._base_manager.using(using).filter(opts.status_q("waiting"))
    keys = [key_of(pk) for pk in rows.order_by("pk").values_list("pk", flat=True)[:limit]]
    if not keys:
        return []
    edges: dict[str, list[tuple[str, str, str]]] = {key: [] for key in keys}
    for i in range(0, len(keys), CHUNK):
        for dkey, plabel, pkey, policy in (
            _edges(using)
            .filter(dependent_model=label, dependent_pk__in=keys[i : i + CHUNK], outcome=OPEN)
            .values_list("dependent_pk", "prerequisite_model", "prerequisite_pk", "on_failure")
        ):
            edges[dkey].append((plabel, pkey, policy))
    states: dict[tuple[str, str], str | None] = {}
    wanted: dict[str, set[str]] = {}
    for found in edges.values():
        for plabel, pkey, _ in found:
            wanted.setdefault(plabel, set()).add(pkey)
    for plabel, pkeys in wanted.items():
        try:
            pmodel = apps.get_model(plabel)
        except LookupError:
            continue  # the model is gone: its edges read as prerequisites gone
        popts = get_options(pmodel)
        ordered = sorted(pkeys)
        for i in range(0, len(ordered), CHUNK):
            chunk = [_pk(pmodel, k) for k in ordered[i : i + CHUNK]]
            for pk, status in (
                pmodel._base_manager.using(using)
                .filter(pk__in=chunk)
                .values_list("pk", popts.status_field)
            ):
                states[(plabel, key_of(pk))] = popts.state_of(status)
    out: list[tuple[Any, str]] = []
    for dkey in keys:
        found = edges[dkey]
        if not found:
            out.append((_pk(model, dkey), "waits for nothing: every prerequisite settled"))
            continue
        for plabel, pkey, policy in found:
            state = states.get((plabel, pkey), "gone")
            if state == "gone":
                out.append((_pk(model, dkey), f"prerequisite {plabel} #{pkey} is gone"))
                break
            if state in TERMINAL_STATES:
                if policy == "hold" and state != "done":
                    why = f"{HELD}: prerequisite {plabel} #{pkey} ended {state}"
                else:
                    why = f"prerequisite {plabel} #{pkey} ended {state} without releasing it"
                out.append((_pk(model, dkey), why))
                break
    return out
