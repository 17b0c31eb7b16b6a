"""``manage.py taskclaim_queue pause|resume|status``, the paused queues in
``taskclaim_stats`` and the doctor's ``TC-D024``."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_taskclaim import is_paused, pause, paused
from django_taskclaim.ops.doctor import diagnose
from tests.support.flowapp.models import Errand
from tests.support.testapp.models import Document
from tests.support.worker_procs import run_command

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = StringIO()
    call_command("taskclaim_queue", *args, stdout=out)
    return out.getvalue()


def test_pause_status_resume():
    Errand.objects.bulk_create([Errand(queue_name="a") for _ in range(3)])
    out = run("pause", "flowapp.Errand", "--queue", "a", "--reason", "deploy", "--by", "ops")
    assert out.startswith("paused: flowapp.Errand queue a paused since ")
    assert "by ops (deploy), 3 ready rows waiting" in out
    assert run("pause", "flowapp.Errand", "--queue", "a").startswith("already paused: ")
    assert is_paused(Errand, "a")
    run("pause", "testapp.Document")  # by defaults to user@host
    assert "@" in paused(Document)[0].paused_by
    status = run("status")
    assert status.splitlines()[0].startswith("flowapp.Errand queue a paused since")
    assert "testapp.Document every queue paused since" in status
    assert "0 ready rows waiting" in status
    doc = json.loads(run("status", "flowapp.Errand", "--json"))
    assert [(r["model"], r["queue"], r["ready"], r["paused_by"]) for r in doc["paused"]] == [
        ("flowapp.Errand", "a", 3, "ops")
    ]
    assert run("resume", "flowapp.Errand", "--queue", "a") == "resumed: flowapp.Errand queue a\n"
    assert run("resume", "flowapp.Errand", "--queue", "a").startswith("not paused: ")
    assert run("status", "flowapp.Errand") == "no queue is paused\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["pause"], "pause needs a model"),
        (["pause", "nope.Nope"], "no model 'nope.Nope' is installed"),
        (["pause", "Errand"], "is not a model label"),
        (["pause", "flowapp.ErrandRun"], "flowapp.ErrandRun is not claimable"),
        (["pause", "testapp.Document", "--queue", "a"], "has no queue_name field"),
        (["status", "testapp.Document", "--queue", "a"], "has no queue_name field"),
        (["status", "--queue", "a"], "--queue needs a model"),
        (["resume", "flowapp.Errand", "--reason", "x"], "--reason goes with pause"),
        (["pause", "flowapp.Errand", "--database", "nope"], "unknown database alias 'nope'"),
    ],
)
def test_mistakes_are_one_clear_line(args, says):
    with pytest.raises(CommandError, match=says):
        run(*args)
    assert paused() == []


def test_a_mistake_on_the_command_line_prints_no_traceback():
    done = run_command("taskclaim_queue", "pause", "flowapp.Errand", "--queue", "")
    assert done.returncode == 1
    assert "queue must be a non-empty string" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_command("taskclaim_queue", "pause", "testapp.Ledger")
    assert done.returncode == 1
    assert "testapp.Ledger is not claimable" in done.stderr
    assert "Traceback" not in done.stderr


def test_stats_and_doctor_show_paused_queues_with_their_backlog():
    Errand.objects.bulk_create([Errand(queue_name="a") for _ in range(2)])
    pause(Errand, "a", by="ops", reason="slow API")
    out = StringIO()
    call_command("taskclaim_stats", "flowapp.Errand", stdout=out)
    text = out.getvalue()
    assert "paused queues: 1" in text
    assert "flowapp.Errand queue a paused since" in text
    assert "by ops (slow API), 2 ready rows waiting" in text
    out = StringIO()
    call_command("taskclaim_stats", "--json", stdout=out)
    assert [(r["queue"], r["ready"]) for r in json.loads(out.getvalue())["paused"]] == [("a", 2)]

    (found,) = [f for f in diagnose([Errand]) if f.id == "TC-D024"]
    assert found.severity == "warning"
    assert "queue a paused since" in found.title
    assert "by ops" in found.title
    assert "2 ready rows waiting" in found.title
    assert found.fix.endswith("python manage.py taskclaim_queue resume flowapp.Errand --queue a")
    (clear,) = [f for f in diagnose([Document]) if f.id == "TC-D024"]
    assert clear.severity == "ok"
