"""Task functions for the ``django.tasks`` backend tests.

The first group are the examples of Django's Tasks documentation, as written there;
the rest drive failure and recovery scenarios. The module is imported by the test
process and by worker subprocesses alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os

from django.core.mail import send_mail
from django.tasks import task
from django.tasks.signals import task_finished, task_started

from django_taskclaim.contrib.tasks.backend import ClaimTask
from django_taskclaim.exceptions import Fail, Retry
from tests.support.helpers import simulate_work

logger = logging.getLogger(__name__)


# -- Django's documentation examples --------------------------------------------------
@task
def email_users(emails, subject, message):
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task(priority=2, queue_name="emails")
def email_users_on_queue(emails, subject, message):
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task(takes_context=True)
def email_users_with_context(context, emails, subject, message):
    logger.debug(
        f"Attempt {context.attempt} to send user email. Task result id: {context.task_result.id}."
    )
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def process_data(data):
    return data


@task()
def double_dictionary(key):
    return {key: key * 2}


@task
def my_task(thing_num):
    from tests.support.testapp.models import Document

    return Document.objects.get(title=f"thing {thing_num}").pk


# -- more behaviours ----------------------------------------------------------------------
@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return {"sum": a + b, "loop": asyncio.get_running_loop().is_running()}


@task
def raise_value_error(message):
    raise ValueError(message)


@task
def fail_for_good(reason):
    raise Fail(reason)


@task
def retry_later(delay):
    raise Retry(delay, reason=f"not yet, retry in {delay}s")


@task(takes_context=True)
def flaky(context, succeed_on):
    """Raises until attempt ``succeed_on``, then returns the attempt number."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def slow_first_attempt(context, marker):
    """Attempt 1 announces itself and then runs until killed (at most 120 s);
    later attempts record one completion as a Document titled ``marker``."""
    from tests.support.testapp.models import Document

    if context.attempt == 1:
        Document.objects.create(title=f"{marker} started pid={os.getpid()}")
        simulate_work(120)  # until the test kills this worker
    Document.objects.create(title=marker)
    return {"attempt": context.attempt, "pid": os.getpid()}


@task
def returns_unserialisable():
    return {1, 2, 3}


@task(max_attempts=1)
def one_shot(message):
    raise RuntimeError(message)


@task
def add(a, b=0):
    return a + b


@task
def returns_nan():
    return float("nan")


@task
def returns_tuple_and_bytes():
    return (1, "two", b"three")


@task
def retry_in_a_timedelta(minutes):
    from datetime import timedelta

    raise Retry(timedelta(minutes=minutes))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TracedTask(ClaimTask):
    """A Task class with its own ``call()``: the worker must call through it."""

    def call(self, *args, **kwargs):
        return {"called_through": "TracedTask.call", "value": ClaimTask.call(self, *args, **kwargs)}


def traced_add(a, b=0):
    return a + b


traced_add = TracedTask(func=traced_add)  # the name now holds the Task, as with @task


# -- receivers of Django's task signals, connected in worker processes that ask for them --
def _record_started(sender, task_result, **kwargs):
    from tests.support.testapp.models import Document

    Document.objects.create(
        title=f"started {task_result.id}",
        kind=task_result.status.value,
        payload={"sender": sender.__name__, "worker_ids": task_result.worker_ids},
    )


def _record_finished(sender, task_result, **kwargs):
    from django.tasks import default_task_backend

    from tests.support.testapp.models import Document

    stored = default_task_backend.get_result(task_result.id)  # written before the signal
    Document.objects.create(
        title=f"finished {task_result.id}",
        kind=task_result.status.value,
        payload={
            "return_value": task_result.return_value,
            "stored_status": stored.status.value,
            "stored_return_value": stored.return_value,
        },
    )


if os.environ.get("TASKCLAIM_TEST_TASK_RECEIVERS"):
    task_started.connect(_record_started)
    task_finished.connect(_record_finished)
