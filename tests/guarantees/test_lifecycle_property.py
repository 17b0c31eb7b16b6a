"""The fenced lifecycle as a state machine, driven in random orders (Hypothesis).

Several claimers, the reaper, an operator, heartbeats, crashes and the database clock
moving act on a few rows of ``Document`` in whatever order Hypothesis draws, against a
small reference model of what each row's status, token, attempts and lease must be.
After every step the rows in the database must be exactly the model's, and:

- ONE HOLDER: at most one task object in the claimers' hands carries a row's current
  token while the row is ``processing``, and the row names that claimer;
- FENCED: a write under a token that is no longer current raises ``ClaimLost`` (or,
  through ``run_task``, returns ``"lost"``) and changes nothing, in the row or in the
  ledger a ``fenced()`` block writes to;
- NO LOSS: every row is in one of the five states, none disappears;
- tokens: every claim, settle, reap and operator action moves the row's token by exactly
  one, so a row's tokens strictly increase; a lease renewal leaves it;
- NO EARLY RE-RUN: a claim takes only rows that are ``ready`` and due; a reap takes only
  rows whose lease ended before the database's ``now()``, and every such row.

Time is the database's: "the clock moves" shifts every lease end and ``run_after`` back
by the same amount (what waiting would do, without waiting), and the model decides
"expired" and "due" against ``db_now()`` read around each claim and reap.

A failure shrinks to the shortest story that breaks a rule and is printed step by step.
Budget: ``TASKCLAIM_PROPERTY_EXAMPLES`` stories (default 50) of at most
``TASKCLAIM_PROPERTY_STEPS`` steps (default 30), derandomized so every run of the suite
draws the same stories; ``TASKCLAIM_PROPERTY_SEED=<int>`` or ``=random`` draws others.
See docs/testing.md.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test import override_settings
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_taskclaim import ClaimLost, Fail, Outcome, Retry, reap, release_worker, run_task
from django_taskclaim.claim import STRATEGIES
from django_taskclaim.db import db_now
from tests.support.testapp.models import Document, Ledger

pytestmark = pytest.mark.django_db(transaction=True)

MAX_ATTEMPTS = 3
LEASE = 30.0  # Document.ClaimMeta.lease
CLAIMERS = ("c1", "c2", "c3")
MAX_ROWS = 3
STATES = {"ready", "processing", "done", "failed", "cancelled"}
#: how far the clock may move in one step (relative to the next running lease end, if any)
CLOCK_STEPS = ("to a moment before the next lease ends", "just after the next lease ends", "1 h")


def budget() -> settings:
    """The Hypothesis settings of this run (module docstring)."""
    chosen = os.environ.get("TASKCLAIM_PROPERTY_SEED", "")
    return settings(
        max_examples=int(os.environ.get("TASKCLAIM_PROPERTY_EXAMPLES", "50")),
        stateful_step_count=int(os.environ.get("TASKCLAIM_PROPERTY_STEPS", "30")),
        derandomize=chosen == "",
        database=None,  # nothing written to .hypothesis/
        deadline=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        print_blob=True,
    )


@dataclass(frozen=True)
class Row:
    """What the model says one row holds."""

    status: str
    version: int
    attempts: int
    holder: str  # locked_by, meaningful while processing
    locked_until: datetime | None
    run_after: datetime | None


def db_rows() -> dict[int, Row]:
    out = {}
    for r in Document._base_manager.values(
        "pk", "status", "version", "attempts", "locked_by", "locked_until", "run_after"
    ):
        out[r["pk"]] = Row(
            r["status"],
            r["version"],
            r["attempts"],
            r["locked_by"],
            r["locked_until"],
            r["run_after"],
        )
    return out


@functools.cache
def strategies_here() -> list[str | None]:
    """The claim strategies this database offers, besides its default (``None``);
    ``hold`` needs the caller's transaction and is left out."""
    names = sorted(n for n, s in STRATEGIES.items() if n != "hold" and s.supported("default"))
    return [None, *names]


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Ledger.objects.all().delete()
        Document._base_manager.all().delete()
        self.rows: dict[int, Row] = {}
        #: what each claimer holds: every task object it got, current or stale
        self.held: dict[str, list[Document]] = {c: [] for c in CLAIMERS}
        #: ledger entries the model expects: (task_id, token) written by a fenced block
        self.ledger: list[tuple[int, int]] = []

    # -- helpers ----------------------------------------------------------------------
    def current(self, task: Document) -> bool:
        """The model's fence: the task carries its row's token and the row is held."""
        row = self.rows[task.pk]
        return row.status == "processing" and row.version == task.version

    def settled(self, task: Document, status: str, **changes: Any) -> None:
        """A fenced write of ``task`` landed: the row moves to ``status``, token + 1."""
        row = self.rows[task.pk]
        self.rows[task.pk] = replace(row, status=status, version=row.version + 1, **changes)
        assert task.version == row.version + 1, "the instance carries the new token"

    # -- the rows ---------------------------------------------------------------------
    @initialize(n=st.integers(1, MAX_ROWS))
    def enqueue(self, n: int) -> None:
        for i in range(n):
            doc = Document.objects.create(title=f"r{i}")
            self.rows[doc.pk] = Row("ready", doc.version, 0, "", None, None)

    # -- claimers ---------------------------------------------------------------------
    @rule(data=st.data(), claimer=st.sampled_from(CLAIMERS), n=st.integers(1, 2))
    def claim(self, data: Any, claimer: str, n: int) -> None:
        strategy = data.draw(st.sampled_from(strategies_here()), label="strategy")
        before = db_now()
        got = Document.objects.claim(n, worker=claimer, strategy=strategy)
        self.claimed(claimer, n, got, before, db_now())

    @rule(claimer=st.sampled_from(CLAIMERS))
    def claim_next(self, claimer: str) -> None:
        before = db_now()
        task = Document.objects.claim_next(worker=claimer)
        self.claimed(claimer, 1, [task] if task else [], before, db_now())

    def claimed(
        self, claimer: str, n: int, got: list[Document], before: datetime, after: datetime
    ) -> None:
        """Check a claim against the model (only ready, due rows; as many as asked for
        and there are; token and attempts + 1; lease = the database's now() + lease)."""

        def due(at: datetime) -> set[int]:
            return {
                pk
                for pk, r in self.rows.items()
                if r.status == "ready" and (r.run_after is None or r.run_after <= at)
            }

        pks = [t.pk for t in got]
        assert len(set(pks)) == len(pks), "one row handed out twice in one claim"
        assert set(pks) <= due(after), f"claimed {set(pks) - due(after)}: not ready and due"
        assert len(pks) >= min(n, len(due(before))), f"claimed {pks} of {due(before)}"
        fresh = {r.pk: r for r in Document._base_manager.filter(pk__in=pks)}
        lo, hi = before + timedelta(seconds=LEASE), after + timedelta(seconds=LEASE)
        for task in got:
            old, db = self.rows[task.pk], fresh[task.pk]
            assert task.version == db.version == old.version + 1, "a claim moves the token"
            assert task.attempts == db.attempts == old.attempts + 1, "a claim counts"
            assert db.locked_by == claimer
            assert lo <= db.locked_until <= hi, "lease = the database's now() + lease"
            self.rows[task.pk] = replace(
                old,
                status="processing",
                version=old.version + 1,
                attempts=old.attempts + 1,
                holder=claimer,
                locked_until=db.locked_until,
            )
            self.held[claimer].append(task)

    def holding(self) -> list[str]:
        return [c for c in CLAIMERS if self.held[c]]

    def latest(self, claimer: str) -> list[Document]:
        """The claimer's newest task object of each row: what a worker acknowledges or
        renews together (one per row; ``complete_many()`` refuses a row twice)."""
        return list({t.pk: t for t in self.held[claimer]}.values())

    def pick(self, data: Any) -> tuple[str, Document]:
        """A claimer that holds task objects, and one of them (current or stale)."""
        claimer = data.draw(st.sampled_from(self.holding()), label="claimer")
        tasks = self.held[claimer]
        # shown in a failing story as the row and the token this object carries
        names = [f"{t.title} token {t.version} (#{i})" for i, t in enumerate(tasks)]
        return claimer, tasks[names.index(data.draw(st.sampled_from(names), label="task"))]

    # Each fenced write of one task object a claimer holds (current or stale): it lands
    # under the row's current token, else raises ``ClaimLost`` and changes nothing.
    def stale(self, task: Document, write: Any) -> bool:
        if self.current(task):
            return False
        with pytest.raises(ClaimLost):
            write()
        return True

    @precondition(lambda self: self.holding())
    @rule(data=st.data())
    def complete(self, data: Any) -> None:
        claimer, task = self.pick(data)
        if not self.stale(task, lambda: task.complete(result="late")):
            task.complete(result=f"by {claimer}")
            self.settled(task, "done", locked_until=None)

    @precondition(lambda self: self.holding())
    @rule(data=st.data())
    def fail(self, data: Any) -> None:
        _, task = self.pick(data)
        if not self.stale(task, lambda: task.fail("late")):
            task.fail("boom")
            self.settled(task, "failed", locked_until=None)

    @precondition(lambda self: self.holding())
    @rule(data=st.data(), delay=st.sampled_from([0, 60]))
    def retry(self, data: Any, delay: int) -> None:
        _, task = self.pick(data)
        if not self.stale(task, lambda: task.retry(delay=delay)):
            before = db_now()
            self.retried(task, task.retry(delay=delay), delay, before)

    @precondition(lambda self: self.holding())
    @rule(data=st.data())
    def release(self, data: Any) -> None:
        """Given back: ``ready`` now, the attempt not counted."""
        _, task = self.pick(data)
        if not self.stale(task, task.release):
            task.release()
            attempts = self.rows[task.pk].attempts - 1
            self.settled(task, "ready", locked_until=None, attempts=attempts)

    @precondition(lambda self: self.holding())
    @rule(data=st.data())
    def extend_lease(self, data: Any) -> None:
        """A lease renewal of one task: ``now() + 5 s``, the token unchanged."""
        _, task = self.pick(data)
        if not self.stale(task, lambda: task.extend_lease(5)):
            before = db_now()
            task.extend_lease(5)
            until = Document._base_manager.get(pk=task.pk).locked_until
            assert before + timedelta(seconds=5) <= until <= db_now() + timedelta(seconds=5)
            row = self.rows[task.pk]
            assert task.version == row.version, "a lease renewal keeps the token"
            self.rows[task.pk] = replace(row, locked_until=until)

    def retried(self, task: Document, outcome: str, delay: int, before: datetime) -> None:
        if task.attempts >= MAX_ATTEMPTS:
            assert outcome == "failed", "attempts used up: failed"
            self.settled(task, "failed", locked_until=None)
            return
        assert outcome == "ready"
        run_after = None
        if delay:
            run_after = Document._base_manager.get(pk=task.pk).run_after
            lo, hi = before + timedelta(seconds=delay), db_now() + timedelta(seconds=delay)
            assert lo <= run_after <= hi, "run_after = the database's now() + delay"
        self.settled(task, "ready", locked_until=None, run_after=run_after)

    @precondition(lambda self: self.holding())
    @rule(data=st.data(), body=st.sampled_from(["returns", "fail", "retry-now", "retry-later"]))
    def run_body(self, data: Any, body: str) -> None:
        """``run_task`` with a body that returns, raises ``Fail`` or ``Retry``: a stale
        holder's outcome is ``"lost"`` and nothing is written."""
        _, task = self.pick(data)

        def handler(t: Document) -> dict[str, str] | None:
            if body == "fail":
                raise Fail("no")
            if body.startswith("retry"):
                raise Retry(delay=60 if body == "retry-later" else 0)
            return {"result": "ran"}

        held = self.current(task)
        settled = task.status != "processing"  # this instance was settled already
        before = db_now()
        outcome = run_task(task, handler)
        if settled and body == "returns":
            assert outcome == task.status, "a row the body finished: its state, no write"
            return
        if not held:
            assert outcome == Outcome.LOST, "a stale holder's outcome is lost"
            return
        if body == "returns":
            assert outcome == Outcome.DONE
            self.settled(task, "done", locked_until=None)
        elif body == "fail":
            assert outcome == Outcome.FAILED
            self.settled(task, "failed", locked_until=None)
        else:
            self.retried(task, outcome, 60 if body == "retry-later" else 0, before)

    @precondition(lambda self: self.holding())
    @rule(data=st.data(), complete=st.booleans())
    def fenced_block(self, data: Any, complete: bool) -> None:
        """The user's own write inside ``fenced()``: it commits only under a current
        claim (and, with ``complete=True``, together with the completion)."""
        claimer, task = self.pick(data)
        token = task.version

        def block() -> None:
            with task.fenced(complete=complete):
                Ledger.objects.create(task_id=task.pk, token=token, worker=claimer)

        if not self.current(task):
            with pytest.raises(ClaimLost):
                block()
            return
        block()
        self.ledger.append((task.pk, token))
        if complete:
            self.settled(task, "done", locked_until=None)

    @precondition(lambda self: self.holding())
    @rule(data=st.data())
    def complete_many(self, data: Any) -> None:
        """One batched acknowledgement of everything a claimer holds, stale or not."""
        claimer = data.draw(st.sampled_from(self.holding()), label="claimer")
        tasks = self.latest(claimer)
        current = [t for t in tasks if self.current(t)]
        stale = {id(t) for t in tasks if not self.current(t)}
        lost = Document.objects.complete_many(tasks)
        assert {id(t) for t in lost} == stale, "complete_many: lost = the stale claims"
        for task in current:
            self.settled(task, "done", locked_until=None)

    @precondition(lambda self: self.holding())
    @rule(seconds=st.sampled_from([None, 5.0]))
    def heartbeats(self, seconds: float | None) -> None:
        """Every claimer's heartbeat renews the leases it holds (``renew_leases``, the
        worker's): the current ones from ``now()``, tokens unchanged; the stale ones
        are reported lost and not touched."""
        length = timedelta(seconds=LEASE if seconds is None else seconds)
        for claimer in self.holding():
            tasks = self.latest(claimer)
            before = db_now()
            lost, busy = Document.objects.renew_leases(tasks, seconds)
            after = db_now()
            assert busy == []
            stale = {id(t) for t in tasks if not self.current(t)}
            assert {id(t) for t in lost} == stale, f"{claimer}: lost = its stale claims"
            pks = [t.pk for t in tasks]
            ends = dict(Document._base_manager.filter(pk__in=pks).values_list("pk", "locked_until"))
            for task in tasks:
                if self.current(task):
                    until = ends[task.pk]
                    assert before + length <= until <= after + length, "renewed from now()"
                    self.rows[task.pk] = replace(self.rows[task.pk], locked_until=until)

    @precondition(lambda self: self.holding())
    @rule(data=st.data(), seen=st.booleans())
    def crash(self, data: Any, seen: bool) -> None:
        """A claimer dies with what it held. Unseen, its rows wait for their leases to
        end; ``seen`` (its supervisor saw it exit: proof of death), they come back at
        once whatever their leases (``release_worker``)."""
        claimer = data.draw(st.sampled_from(self.holding()), label="claimer")
        self.held[claimer] = []
        if not seen:
            return
        result = release_worker(claimer, Document)
        taken = {
            pk for pk, r in self.rows.items() if r.status == "processing" and r.holder == claimer
        }
        self.take_back(taken, result)

    # -- the clock, the reaper, the operator -------------------------------------------
    @precondition(lambda self: any(r.locked_until or r.run_after for r in self.rows.values()))
    @rule(by=st.sampled_from(CLOCK_STEPS), then_reap=st.booleans())
    def clock_moves(self, by: str, then_reap: bool) -> None:
        """Time passes on the database clock: every lease end and ``run_after`` is that
        much nearer (moved back, rather than waited for). ``by``: an hour, or to half a
        second before (or after) the next running lease ends (a second when none runs).
        ``then_reap``: a worker's periodic reap comes right after."""
        step = timedelta(seconds=3600 if by == "1 h" else 1)
        now = db_now()
        running = [
            r.locked_until
            for r in self.rows.values()
            if r.status == "processing" and r.locked_until and r.locked_until > now
        ]
        if running and by.endswith("the next lease ends"):
            half = timedelta(seconds=0.5)
            step = min(running) - now + (half if by.startswith("just after") else -half)
            step = max(step, timedelta(0))
        Document._base_manager.filter(locked_until__isnull=False).update(
            locked_until=F("locked_until") - step
        )
        Document._base_manager.filter(run_after__isnull=False).update(
            run_after=F("run_after") - step
        )
        for pk, r in self.rows.items():
            self.rows[pk] = replace(
                r,
                locked_until=None if r.locked_until is None else r.locked_until - step,
                run_after=None if r.run_after is None else r.run_after - step,
            )
        if then_reap and any(r.status == "processing" for r in self.rows.values()):
            self.reaper()

    @precondition(lambda self: any(r.status == "processing" for r in self.rows.values()))
    @rule()
    def reaper(self) -> None:
        before = db_now()
        result = reap(Document)
        after = db_now()
        taken = {pk for pk, r in db_rows().items() if r.version != self.rows[pk].version}
        for pk, r in self.rows.items():
            if r.status != "processing":
                assert pk not in taken, f"reaped row {pk}, which was {r.status}"
                continue
            if r.locked_until < before:
                assert pk in taken, f"row {pk}'s lease ended at {r.locked_until}, not reaped"
            if r.locked_until >= after:
                assert pk not in taken, (
                    f"row {pk} reaped at {before}..{after}: its lease ends {r.locked_until}"
                )
        self.take_back(taken, result)

    def take_back(self, taken: set[int], result: Any) -> None:
        """Reaped (or released from a dead worker): ``failed`` with the attempts used up,
        else ``ready`` marked recovered (the lease end stays); the token moves."""
        for pk in taken:
            r = self.rows[pk]
            if r.attempts >= MAX_ATTEMPTS:
                r = replace(r, status="failed", locked_until=None)
            else:
                r = replace(r, status="ready")
            self.rows[pk] = replace(r, version=r.version + 1)
        failed = sum(self.rows[pk].status == "failed" for pk in taken)
        assert (result.requeued, result.failed) == (len(taken) - failed, failed)

    @rule(data=st.data(), action=st.sampled_from(["requeue", "cancel"]))
    def operator(self, data: Any, action: str) -> None:
        """An operator requeues failed, cancelled and done rows (due now, attempts
        reset), or cancels ready and processing rows, one row or all of them (the
        admin's actions are these). The token of every row changed moves."""
        self.operator_acts(data, action)

    @precondition(lambda self: any(r.status == "processing" for r in self.rows.values()))
    @rule(data=st.data())
    def operator_takes_back(self, data: Any) -> None:
        """An operator releases processing rows, whatever their leases: ``ready``,
        marked recovered; the holder is fenced."""
        self.operator_acts(data, "release")

    def operator_acts(self, data: Any, action: str) -> None:
        titles = {f"r{i}": pk for i, pk in enumerate(sorted(self.rows))}
        which = data.draw(st.sampled_from(["all", *titles]), label="rows")
        pk = titles.get(which)
        qs = Document.objects.all() if pk is None else Document.objects.filter(pk=pk)
        scope = set(self.rows) if pk is None else {pk}
        sources = {
            "requeue": ("done", "failed", "cancelled"),
            "release": ("processing",),
            "cancel": ("ready", "processing"),
        }[action]
        moved = {p for p in scope if self.rows[p].status in sources}
        before = db_now()
        assert getattr(qs, action)() == len(moved)
        after = db_now()
        due = dict(Document._base_manager.filter(pk__in=moved).values_list("pk", "run_after"))
        for p in moved:
            r = replace(self.rows[p], version=self.rows[p].version + 1)
            if action == "requeue":
                # due now: no run_after, or the database's now() of the requeue
                assert due[p] is None or before <= due[p] <= after, "requeued: due at once"
                r = replace(r, status="ready", attempts=0, locked_until=None, run_after=due[p])
            elif action == "release":
                r = replace(r, status="ready")
            else:
                r = replace(r, status="cancelled", locked_until=None)
            self.rows[p] = r

    # -- after every step ---------------------------------------------------------------
    @invariant()
    def database_agrees(self) -> None:
        rows = db_rows()
        self.rows_are_the_models(rows)
        self.one_holder(rows)
        self.fenced_writes_only()

    def rows_are_the_models(self, rows: dict[int, Row]) -> None:
        assert set(rows) == set(self.rows), "NO LOSS: a row appeared or disappeared"
        for pk, db in rows.items():
            want = self.rows[pk]
            assert db.status in STATES, f"row {pk} in no known state: {db.status!r}"
            got = (db.status, db.version, db.attempts, db.locked_until, db.run_after)
            exp = (want.status, want.version, want.attempts, want.locked_until, want.run_after)
            assert got == exp, f"row {pk}: database {got}, model {exp}"
            if db.status == "processing":
                assert db.holder == want.holder, f"row {pk} names {db.holder}, not {want.holder}"

    def one_holder(self, rows: dict[int, Row]) -> None:
        for pk, row in rows.items():
            holders = [
                c
                for c, tasks in self.held.items()
                for t in tasks
                if t.pk == pk and t.version == row.version and row.status == "processing"
            ]
            assert len(holders) <= 1, f"row {pk} held by {holders}"
            if holders:
                assert holders == [row.holder], f"row {pk} held by {holders}, names {row.holder}"

    def fenced_writes_only(self) -> None:
        got = sorted(Ledger.objects.values_list("task_id", "token"))
        assert got == sorted(self.ledger), "a fenced block's write landed without the claim"


@pytest.mark.slow
def test_lifecycle_matches_its_model():
    machine: Any = Lifecycle
    chosen = os.environ.get("TASKCLAIM_PROPERTY_SEED", "")
    if chosen not in ("", "random"):
        machine = seed(int(chosen))(Lifecycle)
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=MAX_ATTEMPTS):
        run_state_machine_as_test(machine, settings=budget())
    assert connection.in_atomic_block is False
