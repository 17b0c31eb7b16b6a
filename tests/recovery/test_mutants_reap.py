"""What ``reap()`` / ``release_worker()`` leave on real rows, at the boundaries the reaper
tests do not pin (docs/testing.md, "Mutation testing": these tests kill the mutants of
``django_taskclaim/recovery/reap.py`` that the reaper tests leave alive): the attempts
limit, the batches, the counts per model, the reason written, the signal.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_taskclaim import reap
from django_taskclaim.db import DbNow
from django_taskclaim.recovery.reap import ReapResult, release_worker
from django_taskclaim.signals import task_reaped
from tests.support.helpers import BusyOnce
from tests.support.testapp.models import Document, Job

pytestmark = pytest.mark.django_db(transaction=True)

MAX = 5  # Document's max_attempts (the default)


def lapsed(n: int, *, worker: str = "gone", attempts: int | None = None) -> list[Document]:
    """``n`` rows claimed by ``worker`` whose leases ended a minute ago."""
    Document.objects.bulk_create([Document(title=f"{worker}-{i}") for i in range(n)])
    rows = Document.objects.filter(title__startswith=f"{worker}-").claim(n, worker=worker)
    assert len(rows) == n
    pks = [r.pk for r in rows]
    Document.objects.filter(pk__in=pks).update(locked_until=DbNow() - timedelta(seconds=60))
    if attempts is not None:
        Document.objects.filter(pk__in=pks).update(attempts=attempts)
    return rows


def statuses() -> dict[str, int]:
    out: dict[str, int] = {}
    for status in Document.objects.values_list("status", flat=True):
        out[status] = out.get(status, 0) + 1
    return out


def test_a_row_one_attempt_short_of_the_limit_is_requeued_at_the_limit_failed():
    short = lapsed(1, worker="short", attempts=MAX - 1)[0]
    spent = lapsed(1, worker="spent", attempts=MAX)[0]
    dry = reap(Document, dry_run=True)
    assert (dry.requeued, dry.failed) == (1, 1)
    assert statuses() == {"processing": 2}  # a dry run writes nothing
    result = reap(Document)
    assert (result.requeued, result.failed, result.total) == (1, 1, 2)
    back = Document.objects.get(pk=short.pk)
    gone = Document.objects.get(pk=spent.pk)
    assert (back.status, back.version, back.attempts) == ("ready", short.version + 1, MAX - 1)
    assert back.locked_until is not None
    assert back.finished_at is None
    assert (gone.status, gone.version, gone.locked_until) == ("failed", spent.version + 1, None)
    assert gone.finished_at is not None
    assert gone.last_error == "lease expired; held by spent"
    assert back.last_error == "lease expired; held by short"


def test_batches_add_up_per_model_and_stop_when_a_batch_is_not_full():
    lapsed(4)
    result = reap(Document, batch_size=2)  # two full batches, then an empty one
    assert (result.requeued, result.failed) == (4, 0)
    assert result.per_model == {"testapp.Document": {"requeued": 4, "failed": 0}}
    assert statuses() == {"ready": 4}


def test_max_batches_bounds_one_pass():
    lapsed(5)
    result = Document.objects.reap(batch_size=2, max_batches=1)
    assert (result.requeued, result.total) == (2, 2)
    assert statuses() == {"ready": 2, "processing": 3}
    result = Document.objects.reap(batch_size=2, max_batches=2)
    assert result.requeued == 3
    assert statuses() == {"ready": 5}


def test_a_batch_of_one_reaps_every_row():
    lapsed(3)
    assert reap(Document, batch_size=1).requeued == 3
    assert statuses() == {"ready": 3}


def test_the_reason_names_the_holder_where_it_asks_and_after_it_otherwise():
    lapsed(1, worker="a")
    lapsed(1, worker="b")
    reap(Document, reason="lost by {} at night")
    assert Document.objects.get(title="a-0").last_error == "lost by a at night"
    lapsed(1, worker="c")
    reap(Document, reason="operator")
    assert Document.objects.get(title="c-0").last_error == "operator (held by c)"


def test_release_worker_reason_and_counts():
    held = lapsed(2, worker="dead", attempts=MAX)
    Document.objects.filter(pk=held[0].pk).update(attempts=1)
    lapsed(1, worker="alive")
    result = release_worker("dead", Document, reason="host {} lost")
    assert (result.requeued, result.failed) == (1, 1)
    assert result.per_model == {"testapp.Document": {"requeued": 1, "failed": 1}}
    assert set(
        Document.objects.filter(title__startswith="dead").values_list("last_error", flat=True)
    ) == {"host dead lost"}
    # the live worker's row is left alone whatever its lease says
    assert Document.objects.get(title="alive-0").status == "processing"
    assert release_worker("dead", Document).total == 0


def test_release_worker_without_a_reason_says_so_and_refuses_a_non_string():
    lapsed(1, worker="w9")
    release_worker("w9", Document)
    assert Document.objects.get(title="w9-0").last_error == "released from worker w9"
    with pytest.raises(ValueError, match="non-empty string"):
        release_worker(None, Document)  # type: ignore[arg-type]


def test_the_signal_carries_the_counts_and_the_database_and_is_quiet_when_nothing_moved():
    seen: list[tuple] = []

    def receiver(sender, requeued, failed, using, **kw):
        seen.append((sender, requeued, failed, using))

    task_reaped.connect(receiver)
    try:
        assert reap(Document).total == 0
        assert seen == []
        lapsed(1, worker="x", attempts=MAX)
        lapsed(2, worker="y")
        reap(Document)
    finally:
        task_reaped.disconnect(receiver)
    assert seen == [(Document, 2, 1, "default")]


def test_reap_of_several_models_adds_each_models_counts():
    lapsed(2)
    Job.objects.bulk_create([Job(name="j")])
    Job.objects.claim(1)
    Job.objects.update(locked_until=DbNow() - timedelta(seconds=60))
    result = reap(Document, Job)
    assert result.per_model == {
        "testapp.Document": {"requeued": 2, "failed": 0},
        "testapp.Job": {"requeued": 1, "failed": 0},
    }
    assert (result.requeued, result.failed) == (3, 0)


def test_reap_result_adds_into_one_entry_per_label():
    result = ReapResult()
    result.add("m", 2, 1)
    result.add("m", 3, 4)
    assert (result.requeued, result.failed, result.total) == (5, 5, 10)
    assert result.per_model == {"m": {"requeued": 5, "failed": 5}}


def test_recover_takes_only_lapsed_leases_and_counts_a_dry_run():
    from django_taskclaim.recovery.reap import recover

    lapsed(2, worker="a")
    Document.objects.bulk_create([Document(title="live")])
    Document.objects.filter(title="live").claim(1, worker="b")
    dry = recover([Document], dry_run=True)
    assert (dry.requeued, statuses()) == (2, {"processing": 3})
    result = recover([Document], batch_size=1)
    assert result.per_model == {"testapp.Document": {"requeued": 2, "failed": 0}}
    assert statuses() == {"ready": 2, "processing": 1}
    assert recover().total == 0  # every claimable model: nothing left to take


def test_recover_and_release_adds_the_released_workers_rows_to_one_result():
    from django_taskclaim.recovery.reap import recover_and_release

    lapsed(1, worker="late")
    Document.objects.bulk_create([Document(title=f"dead-{i}") for i in range(2)])
    Document.objects.filter(title__startswith="dead-").claim(2, worker="dead")
    Document.objects.filter(title="dead-1").update(attempts=MAX)
    Document.objects.bulk_create([Document(title="alive")])
    Document.objects.filter(title="alive").claim(1, worker="alive")
    dry = recover_and_release([Document], release_workers=["dead"], dry_run=True)
    assert (dry.requeued, dry.failed) == (2, 1)
    assert statuses() == {"processing": 4}
    result = recover_and_release([Document], release_workers=["dead"], batch_size=1)
    assert result.per_model == {"testapp.Document": {"requeued": 2, "failed": 1}}
    assert Document.objects.get(title="dead-0").last_error == (
        "released from worker dead by an operator (taskclaim_reap)"
    )
    assert Document.objects.get(title="late-0").last_error == "lease expired; held by late"
    assert Document.objects.get(title="alive").status == "processing"


def test_repeat_until_signalled_passes_until_sigterm_and_puts_the_handlers_back():
    import signal

    from django.db import OperationalError

    from django_taskclaim.recovery.reap import repeat_until_signalled

    lapsed(1)
    errors: list = []
    passes: list = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def one_pass() -> None:
        passes.append(reap(Document).requeued)
        if len(passes) == 2:
            raise OperationalError("gone")
        if len(passes) == 3:
            signal.raise_signal(signal.SIGTERM)  # the pass under way finishes first

    repeat_until_signalled(0, one_pass, errors.append)
    assert passes == [1, 0, 0]
    assert [str(e) for e in errors] == ["gone"]
    assert statuses() == {"ready": 1}
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert Document.objects.count() == 1  # the connection closed after the error reopens


def test_a_reap_by_holder_and_a_dry_run_name_the_model_and_the_worker():
    lapsed(1, worker="w7")
    dry = reap(Document, dry_run=True)
    assert dry.per_model == {"testapp.Document": {"requeued": 1, "failed": 0}}
    Document.objects.bulk_create([Document(title="held")])
    Document.objects.filter(title="held").claim(1, worker="w8")  # a lease still running
    result = reap(Document, held_by=["w8"])
    assert result.requeued == 1
    assert Document.objects.get(title="held").last_error == "released from worker w8"
    assert Document.objects.get(title="w7-0").status == "processing"


def test_a_reason_with_two_holes_fills_the_first():
    lapsed(1, worker="w")
    reap(Document, reason="{} then {}")
    assert Document.objects.get().last_error == "w then {}"


def test_max_batches_counts_every_batch():
    lapsed(6)
    assert Document.objects.reap(batch_size=2, max_batches=2).requeued == 4
    assert statuses() == {"ready": 4, "processing": 2}


def test_release_worker_takes_only_the_named_models_rows_or_every_models():
    lapsed(1, worker="dead")
    Job.objects.bulk_create([Job(name="j")])
    Job.objects.claim(1, worker="dead")
    assert release_worker("dead", Document).requeued == 1
    assert Job.objects.get().status == Job.PENDING
    assert release_worker("dead").per_model == {"testapp.Job": {"requeued": 1, "failed": 0}}
    assert Job.objects.get().status == Job.NEW


def test_a_reap_that_finds_the_database_busy_is_retried(caplog):
    from django.db import connection

    lapsed(2)
    busy = BusyOnce()

    with caplog.at_level("DEBUG", logger="django_taskclaim"), connection.execute_wrapper(busy):
        assert reap(Document).requeued == 2
    assert busy.left == 0
    assert any(m.startswith("retrying what=reap attempt=1 ") for m in caplog.messages)
