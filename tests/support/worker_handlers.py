"""Handlers used by the worker tests (selected through ``tests.support.worker_entry``)."""

from __future__ import annotations

import os
import signal

from tests.support.helpers import simulate_work
from tests.support.testapp.models import Ledger

ATTEMPT = "attempt:"


def process_atomic(task):
    """Log the attempt, act on the payload, then write the ledger row and complete the
    task in ONE fenced transaction: the side effect commits exactly when the task does.

    Attempt rows (``worker`` starting with ``attempt:``) record when each claim started
    running, on the database clock (``Ledger.at``).
    """
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    payload = task.payload or {}
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if payload.get("sleep"):
        simulate_work(payload["sleep"])
    with task.fenced():
        Ledger.objects.create(task_id=task.pk, token=task.version, worker=task.locked_by)
        task.complete(result=f"processed {task.pk}")


def process_quietly(task):
    """Do nothing and return no result fields: the worker may batch the completion."""
    return None


def process_logged_quietly(task):
    """Log the attempt, sleep as the payload says, return no result fields."""
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    simulate_work((task.payload or {}).get("sleep", 0))
    return None


BASE_EXCEPTIONS = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
}


def process_hostile(task):
    """Log the attempt, then do what the payload says: ``{"base": "SystemExit"}`` raises
    that ``BaseException``; ``{"kill": true}`` SIGKILLs the process; ``{"sleep": s}``."""
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    payload = task.payload or {}
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if payload.get("base"):
        raise BASE_EXCEPTIONS[payload["base"]]("raised by the task")
    simulate_work(payload.get("sleep", 0))
    return None


# -- exactly-once vs at-least-once (tests/guarantees/test_exactly_once.py) -------------------------
def _effect(task):
    """The task's database side effect: one ledger row per committed run."""
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=task.locked_by)


def _misbehave(task):
    """On the first attempt only, after the effect: what ``payload["then"]`` says —
    ``kill`` (SIGKILL this process), ``raise`` (an error) or ``retry`` (``Retry``)."""
    from django_taskclaim import Retry

    then = (task.payload or {}).get("then")
    if task.attempts != 1 or not then:
        return
    if then == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if then == "raise":
        raise RuntimeError("failed after writing its effect")
    if then == "retry":
        raise Retry(delay=0, reason="asked to retry after writing its effect")


def _start(task):
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    simulate_work((task.payload or {}).get("sleep", 0))


def process_fenced_complete(task):
    """EXACTLY ONCE: the effect and the completion commit together."""
    _start(task)
    with task.fenced(complete=True):
        _effect(task)
        _misbehave(task)


def process_fenced_only(task):
    """AT LEAST ONCE: the effect commits with the block; the completion comes later."""
    _start(task)
    with task.fenced():
        _effect(task)
    _misbehave(task)


def process_plain(task):
    """For ``ClaimMeta.atomic = True``: a plain body; the worker makes it one transaction
    with the completion (the result field is written in it too)."""
    _start(task)
    _effect(task)
    _misbehave(task)
    return {"result": f"atomic {task.pk}"}


# -- cooperative cancellation (tests/settle/test_cancellation.py) --------------------------------
NOTICED = "noticed:"


def _noticed(task):
    """Record, on the database clock, that the body saw its claim taken back."""
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=NOTICED + task.locked_by)


def process_until_cancelled(task):
    """Log the attempt, then work in short slices, asking ``task.cancel_requested()``
    between them, until the claim is taken back (at most 60 s); log when it noticed.
    ``{"quick": true}``: return at once."""
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    if (task.payload or {}).get("quick"):
        return None
    for _slice in range(3000):
        if task.cancel_requested():
            _noticed(task)
            return None
        simulate_work(0.02)
    return None


def process_until_cancel_event(task, cancel):
    """As :func:`process_until_cancelled`, waiting on the ``cancel`` event it is handed."""
    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    if (task.payload or {}).get("quick"):
        return None
    if cancel.wait(60):
        _noticed(task)
    return None


async def process_async_until_cancelled(task):
    """An async handler: log the attempt, then await (standing for I/O) until the claim
    is taken back; ``CancelledError`` is logged as noticed, then re-raised."""
    import asyncio

    from asgiref.sync import sync_to_async

    await Ledger.objects.acreate(
        task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by
    )
    if (task.payload or {}).get("quick"):
        return {"result": "async handler"}
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await sync_to_async(_noticed)(task)
        raise
    return None


# -- outcomes the database refuses (tests/worker/test_seams_heartbeat.py) -------------------------
def process_with_result(task):
    """Log the attempt, then return a ``result`` field: ``"fine"``, or with
    ``payload["poison"]`` a value no database text column stores (``"surrogate"``: a lone
    surrogate; ``"nul"``: a NUL character); batched (``BatchableResult``) unless
    ``payload["plain"]``."""
    from django_taskclaim.settle.batch import BatchableResult

    Ledger.objects.create(task_id=task.pk, token=task.version, worker=ATTEMPT + task.locked_by)
    payload = task.payload or {}
    value = {"surrogate": "x\ud800y", "nul": "a\x00b"}.get(payload.get("poison"), "fine")
    return {"result": value} if payload.get("plain") else BatchableResult({"result": value})


STEP_ONE = "step-one:"
STEP_TWO = "step-two:"


def process_in_steps(task):
    """Two durable steps, each writing a ledger row inside the step (so the row commits
    exactly when the step does); the first attempt SIGKILLs its own process between
    them. The second attempt must skip step one and get its stored result."""
    one = task.step(
        "one",
        lambda: (
            Ledger.objects.create(
                task_id=task.pk, token=task.version, worker=STEP_ONE + task.locked_by
            ).pk
        ),
    )
    if task.attempts == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    task.step(
        "two",
        lambda: (
            Ledger.objects.create(
                task_id=task.pk, token=task.version, worker=f"{STEP_TWO}{one}:{task.locked_by}"
            ).pk
        ),
    )


def process_after_event(task):
    """Wait for the event ``go:<pk>`` (30 s), then complete with its payload as result."""
    payload = task.wait_for_event(f"go:{task.pk}", 30)
    return {"result": f"got {payload}"}


SNOOZED = "snoozed:"


def process_snoozing(task):
    """Log the run (``Ledger.at``, database clock), then ``Snooze(0)`` if the payload
    says ``{"snooze": true}`` (on every run: such a row never ends), else return."""
    from django_taskclaim.exceptions import Snooze

    if (task.payload or {}).get("snooze"):
        Ledger.objects.create(task_id=task.pk, token=task.version, worker=SNOOZED)
        raise Snooze(0)
    return {"result": f"processed {task.pk}"}


#: The one event every row of :func:`process_after_shared_event` waits for.
SHARED_EVENT = "shared-by-all"


def process_after_shared_event(task):
    """Wait for the event :data:`SHARED_EVENT` (600 s), then complete with its payload as
    result: many rows waiting on one name."""
    return {"result": f"got {task.wait_for_event(SHARED_EVENT, 600)}"}


def process_quietly_once_taken_back(task):
    """Return no result fields (a completion the worker batches), but on the first
    attempt take the claim back first, as the reaper does with a lapsed lease (here an
    operator's release): the batch's fence refuses that completion, and the row runs
    again."""
    from django_taskclaim.recovery.reap import release_worker

    if task.attempts == 1:
        assert release_worker(task.locked_by, type(task), reason="taken back").total == 1
    return None
