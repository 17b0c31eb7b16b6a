"""Task functions for the workflow tests of the ``django.tasks`` backend: steps, sleep,
event waits and fan-in callbacks written with the backend's extension. Imported by the
test process and by worker subprocesses alike."""

from __future__ import annotations

from datetime import timedelta

from django.tasks import task

from django_taskclaim.contrib.tasks import (
    astep,
    await_event,
    completed_steps,
    fan_in,
    forget_steps,
    prerequisite_results,
    step,
    wait_for_event,
)
from django_taskclaim.exceptions import EventTimeout, Snooze


@task
def square(n):
    """A fan-out member: ``n * n``; ``n < 0`` fails."""
    if n < 0:
        raise ValueError(f"negative member {n}")
    return n * n


@task(max_attempts=1)
def square_once(n):
    """:func:`square` with one attempt: a negative member fails for good at once."""
    return square.call(n)


@task
def total():
    """A fan-in callback: the members' counts and the sum of the successful ones."""
    counts = fan_in()
    done = prerequisite_results(outcome="done")
    return {
        "total": counts.total if counts else None,
        "done": counts.done if counts else None,
        "failed": counts.failed if counts else None,
        "sum": sum(r.return_value for r in done),
        "ids": [str(r.id) for r in prerequisite_results()],
    }


@task(takes_context=True)
def two_steps(context, marker):
    """Step ``one`` records a Document; attempt 1 then fails; the retry skips ``one``,
    gets its stored result, and records step ``two``."""
    from tests.support.testapp.models import Document

    first = step("one", lambda: Document.objects.create(title=f"{marker} one").pk)
    if context.attempt == 1:
        raise RuntimeError("attempt 1 fails after step one")
    second = step("two", lambda: Document.objects.create(title=f"{marker} two").pk)
    return {"one": first, "two": second, "steps": sorted(completed_steps())}


@task
def sleepy():
    """Parks itself once (``Snooze(0)``: due again after the 1 s floor), then returns."""
    if "slept" not in completed_steps():
        step("slept", lambda: True)
        raise Snooze(0)
    return "woke"


@task
def awaits(name, seconds):
    """Waits for the event ``name``: its payload, or ``"timed out"``."""
    try:
        return {"payload": wait_for_event(name, timedelta(seconds=seconds))}
    except EventTimeout:
        return "timed out"


@task
async def async_steps(marker):
    """An async body with a durable step."""
    from asgiref.sync import sync_to_async

    from tests.support.testapp.models import Document

    def record():
        return Document.objects.create(title=marker).pk

    pk = await astep("record", record)
    again = await astep("record", lambda: -1)  # stored: not run again
    await sync_to_async(lambda: None)()
    return {"pk": pk, "again": again}


@task(takes_context=True)
def forgets(context, marker):
    """Attempt 1 records step ``one``, forgets its steps (a Document notes how many) and
    fails; the retry runs step ``one`` again: two "one" Documents in all."""
    from tests.support.testapp.models import Document

    step("one", lambda: Document.objects.create(title=f"{marker} one").pk)
    if context.attempt == 1:
        Document.objects.create(title=f"{marker} forgot {forget_steps()}")
        raise RuntimeError("attempt 1 fails after forgetting its steps")
    ones = Document.objects.filter(title=f"{marker} one").count()
    return {"steps": sorted(completed_steps()), "ones": ones}


@task
async def async_awaits(name, seconds):
    """:func:`awaits` for an async body: ``await_event``."""
    try:
        return {"payload": await await_event(name, timedelta(seconds=seconds))}
    except EventTimeout:
        return "timed out"
