"""Dependencies between rows: what ``after=`` records at enqueue, and the release of a
row's dependents in the transaction of its final settle. See docs/workflows.md.

The one home of the rule "a row waits until its prerequisites settle":

- :func:`plan_after` (enqueue, inside the producer's transaction): checks ``after=``,
  locks the prerequisite rows, and says in which state the new rows start (``ready``,
  ``waiting``, or ``cancelled`` when a prerequisite already failed and the policy is
  ``cancel``) and which edges to write; :func:`write_edges` writes them.
- :func:`release_dependents` (every final settle of a model declaring
  ``ClaimMeta.dependents``, inside that settle's transaction): closes the settled rows'
  open edges and, under a row lock on each dependent, releases the dependent whose last
  edge it closed (``waiting`` → ``ready``, the workers woken after the commit) or applies
  its policy to a failed prerequisite; a cancelled dependent's own dependents follow.
- :func:`settle_and_release` is how a settle path wraps its write and the release in one
  transaction (retried whole on a deadlock), or runs the write alone for a model whose
  rows nobody may wait for.

Why a row lock on the dependent: two prerequisites settling at once in two
transactions each lock the dependent before they close their edge and count the open
ones, so the second sees the first's edge closed (never both "one still open": stuck;
never both "none open": released twice). The count is a locking read, so MariaDB's
repeatable-read snapshot cannot hide the other's closed edge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import models, transaction

from django_taskclaim.claim.resets import Change, writes
from django_taskclaim.config.discovery import is_claimable
from django_taskclaim.config.options import ClaimOptions, get_options
from django_taskclaim.db import DbNow, retry_transient
from django_taskclaim.exceptions import DependencyError
from django_taskclaim.row.status import TERMINAL_STATES
from django_taskclaim.wakeup.notify import notify

#: A dependent's policy when a prerequisite ends ``failed`` or ``cancelled``.
POLICIES = ("cancel", "run", "hold")
#: The ``outcome`` of an open edge.
OPEN = ""
#: The edge table's model, found through the app registry: it sits above this layer
#: (docs/architecture.md).
EDGE_MODEL = "taskclaim.TaskDependency"
#: The longest primary key text an edge stores (its column's length).
KEY_LENGTH = 191


def _edges(using: str) -> models.QuerySet:
    return apps.get_model(EDGE_MODEL)._base_manager.using(using)


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
    start. Run inside the transaction that inserts them: the prerequisites are locked
    (``FOR UPDATE``) until it commits, so a prerequisite's settle either comes before
    (its final state is read here) or after (it finds the edges this writes). Raises
    :class:`~django_taskclaim.exceptions.DependencyError` before anything is written."""
    prereqs = _check(model, after, using, on_failure, rows)
    by_model: dict[type[models.Model], set[Any]] = {}
    for row in prereqs:
        by_model.setdefault(type(row)._meta.concrete_model or type(row), set()).add(row.pk)
    plan = Plan(state="ready", error=None, policy=on_failure)
    for pmodel in sorted(by_model, key=lambda m: m._meta.label):
        popts = get_options(pmodel)
        fields = [popts.status_field] + (["last_error"] if popts.has("last_error") else [])
        found = {
            key_of(pk): rest
            for pk, *rest in pmodel._base_manager.using(using)
            .select_for_update()
            .filter(pk__in=sorted(by_model[pmodel], key=key_of))
            .order_by("pk")
            .values_list("pk", *fields)
        }
        for pk in sorted(by_model[pmodel], key=key_of):
            key = key_of(pk)
            if key not in found:
                raise DependencyError(f"after=: {popts.label} #{key} does not exist (deleted?)")
            state = popts.state_of(found[key][0]) or "unknown"
            error = str(found[key][1] or "") if len(found[key]) > 1 else ""
            plan.edges.append(_edge_of(plan, label_of(pmodel), key, state, error))
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
    """Write the edges of ``plan`` for the saved rows ``objs`` of ``model``."""
    edge = apps.get_model(EDGE_MODEL)
    label = label_of(model)
    out = []
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
    edge._base_manager.using(using).bulk_create(out)


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
            if _settle_edges(label, set(keys), state, dlabel, dkey, using):
                work.append((dlabel, [dkey], "cancelled"))


def _dependents_of(label: str, keys: list[str], using: str) -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for i in range(0, len(keys), 500):
        found.update(
            _edges(using)
            .filter(prerequisite_model=label, prerequisite_pk__in=keys[i : i + 500], outcome=OPEN)
            .values_list("dependent_model", "dependent_pk")
        )
    return sorted(found)  # one lock order: no deadlock between two settles


def _settle_edges(
    label: str, keys: set[str], state: str, dlabel: str, dkey: str, using: str
) -> bool:
    """Settle the open edges from ``label`` ``keys`` to one dependent, under its row lock;
    return whether the dependent was cancelled (its own dependents follow)."""
    dmodel = apps.get_model(dlabel)
    dopts = get_options(dmodel)
    rows = dmodel._base_manager.using(using).filter(pk=_pk(dmodel, dkey))
    status = rows.select_for_update().values_list(dopts.status_field, flat=True).first()
    open_edges = list(
        _edges(using)
        .select_for_update()
        .filter(dependent_model=dlabel, dependent_pk=dkey, outcome=OPEN)
        .values_list("pk", "prerequisite_model", "prerequisite_pk", "on_failure")
    )
    mine = [e for e in open_edges if e[1] == label and e[2] in keys]
    if not mine:
        return False  # closed by another settle that came first
    policy = mine[0][3]
    waiting = rows.filter(dopts.status_q("waiting"))
    is_waiting = status is not None and dopts.state_of(status) == "waiting"
    if state != "done" and policy == "hold":
        if is_waiting:
            error = _prerequisite_error(label, mine[0][2], using)
            text = _why(label, mine[0][2], state, error, policy)
            waiting.update(**writes(dopts, Change.HOLD, error=text))
        return False
    _edges(using).filter(pk__in=[e[0] for e in mine]).update(outcome=state, settled_at=DbNow())
    if not is_waiting:
        return False
    if state == "done" or policy == "run":
        if len(mine) == len(open_edges):
            waiting.update(
                **{dopts.status_field: dopts.value("ready"), "version": models.F("version") + 1},
                **writes(dopts, Change.UNBLOCK),
            )
            notify(dmodel, using=using)  # after the commit, as for a new row
        return False
    error = _prerequisite_error(label, mine[0][2], using)
    text = _why(label, mine[0][2], state, error, policy)
    waiting.update(
        **{dopts.status_field: dopts.value("cancelled"), "version": models.F("version") + 1},
        **writes(dopts, Change.PREREQUISITE_FAILED, error=text),
    )
    return dopts.dependents


def _prerequisite_error(label: str, key: str, using: str) -> str:
    model = apps.get_model(label)
    if not get_options(model).has("last_error"):
        return ""
    rows = model._base_manager.using(using).filter(pk=_pk(model, key))
    return str(rows.values_list("last_error", flat=True).first() or "")


def open_prerequisites(obj: models.Model) -> list[tuple[str, str]]:
    """The prerequisites ``obj`` still waits for: (model label, primary key text)."""
    using = obj._state.db or "default"
    return list(
        _edges(using)
        .filter(dependent_model=label_of(type(obj)), dependent_pk=key_of(obj.pk), outcome=OPEN)
        .order_by("pk")
        .values_list("prerequisite_model", "prerequisite_pk")
    )
