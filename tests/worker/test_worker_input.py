"""Bad input to the worker and reaper commands: one line naming the fix, nothing changed."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from django_taskclaim.models import Lease, WorkerProcess
from tests.support.markers import ONCE_ON_SQLITE
from tests.support.testapp.models import Document
from tests.support.worker_procs import WorkerProc, run_command

pytestmark = pytest.mark.django_db(transaction=True)


def snapshot() -> tuple:
    return (
        list(Document.objects.order_by("pk").values_list("pk", "status", "version")),
        WorkerProcess.objects.count(),
        Lease.objects.count(),
    )


@pytest.fixture
def docs():
    Document.objects.bulk_create([Document(title=f"i{i}") for i in range(3)])
    return snapshot()


def test_queue_without_any_queue_model_is_refused(monkeypatch):
    """``--queue`` with no model named, where no installed model has a ``queue_name``
    field (the test project has some, so the discovered set is narrowed here)."""
    from django_taskclaim.exceptions import ConfigurationError
    from django_taskclaim.worker import config

    monkeypatch.setattr(config, "claimable_models", lambda: [Document])
    with pytest.raises(ConfigurationError) as info:
        config._models([], "mail")
    assert "--queue needs models with a queue_name field and none has one" in str(info.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["testapp.Nope"], "no model 'testapp.Nope' is installed; claimable models:"),
        (["Document"], "is not a model label; use app_label.ModelName"),
        (["testapp.Ledger"], "Inherit django_taskclaim.models.ClaimableModel"),
        (["--concurrency", "0"], "--concurrency must be > 0, got '0'"),
        (["--processes", "-2"], "--processes must be > 0"),
        (["--batch", "-1"], "--batch must be > 0"),
        (["--batch", "many"], "--batch must be a whole number, got 'many'"),
        (["--lease", "0"], "--lease must be > 0"),
        (["--poll", "-1"], "--poll must be > 0"),
        (["--grace", "-5"], "--grace must be >= 0"),
        (["--ack-window", "-1"], "--ack-window must be >= 0"),
        (["--ack-window", "nan"], "--ack-window must be a finite number"),
        (["--max-tasks", "0"], "--max-tasks must be > 0"),
        (["--until-empty"], "--until-empty goes with --burst"),
        (["--batch", "1e20"], "--batch must be a whole number, got '1e20'"),
        (["--batch", "100000000"], "--batch must be from 1 to 10000"),
        (["--lease", "1e300"], "--lease must be from 1 to 2.592e+06"),
        (["--lease", "inf"], "--lease must be a finite number"),
        (["--poll", "1e300"], "--poll must be from 0.01 to 3600"),
        (["--ack-window", "600"], "--ack-window must be from 0 to 60"),
        (["--concurrency", "100000"], "--concurrency must be from 1 to 256"),
        (["--max-runtime", "0"], "--max-runtime must be > 0"),
        (["--database", "elsewhere"], "--database 'elsewhere' is not in settings.DATABASES"),
        (["testapp.Document", "--queue", "mail"], "--queue needs a queue_name field"),
        (["--no-supervisor", "--processes", "1"], "which --no-supervisor turns off"),
    ],
)
def test_worker_refuses_bad_input(docs, args, message):
    with pytest.raises(CommandError) as info:
        call_command("taskclaim_worker", *args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert snapshot() == docs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--once", "--interval", "5"], "--once and --interval contradict each other"),
        (["--interval", "0"], "--interval must be > 0"),
        (["--batch", "x"], "--batch must be a whole number"),
        (["--interval", "inf"], "--interval must be a finite number"),
        (["--interval", "1e12"], "--interval must be from 0.1 to 86400"),
        (["--release-worker", ""], "--release-worker needs a worker id"),
        (["testapp.Nope"], "no model 'testapp.Nope' is installed"),
        (["--database", "elsewhere"], "--database 'elsewhere' is not in settings.DATABASES"),
    ],
)
def test_reap_refuses_bad_input(docs, args, message):
    with pytest.raises(CommandError) as info:
        call_command("taskclaim_reap", *args)
    assert message in str(info.value)
    assert snapshot() == docs


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("taskclaim_worker", ["testapp.Nope"]),
        ("worker", ["--concurrency", "0"]),
        ("taskclaim_reap", ["--once", "--interval", "1"]),
        ("reaper", ["testapp.Ledger"]),
    ],
)
@ONCE_ON_SQLITE
def test_command_line_error_is_one_line_and_non_zero(docs, command, args):
    done = run_command(command, *args)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("CommandError: ")
    assert "Traceback" not in done.stderr
    assert snapshot() == docs


@pytest.mark.slow
@ONCE_ON_SQLITE
@pytest.mark.parametrize("command", ["worker", "taskclaim_worker"])
def test_a_mistyped_option_names_the_one_it_meant(docs, command):
    done = run_command(command, "--concurency", "3", "--poll=1")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(
        "error: unrecognized arguments: --concurency (did you mean --concurrency?)"
    ), last
    far = run_command(command, "--frobnicate")
    assert far.stderr.strip().splitlines()[-1].endswith("unrecognized arguments: --frobnicate")
    assert snapshot() == docs


def test_model_without_processing_entry_point_is_a_startup_error(docs):
    w = WorkerProc("testapp.Document", claim_meta={"handler": "no_such_method"})
    try:
        assert w.wait(60) == 1
        err = w.stderr().strip().splitlines()
        assert err[-1] == (
            "CommandError: testapp.Document has no processing entry point: define a "
            "process(self) method on it or set ClaimMeta.handler"
        )
        assert "taskclaim.W004" in w.stderr()  # the system check said so first
    finally:
        w.close()
    assert snapshot() == docs


def test_the_worker_runs_its_own_checks_and_only_those(docs):
    """A taskclaim check error stops the worker before it touches a row; an error of some
    other app's check (the project's whole suite is ``manage.py check``'s job) does not."""
    from django.core import checks
    from django.core.management.base import SystemCheckError
    from django.test import override_settings

    with (
        override_settings(TASKCLAIM_LEASE="forever"),
        pytest.raises(SystemCheckError, match=r"taskclaim\.E005"),
    ):
        call_command("taskclaim_worker", "testapp.Document", "--burst")
    assert snapshot() == docs

    def elsewhere(app_configs=None, **kwargs):
        return [checks.Error("an unrelated app is misconfigured", id="other.E001")]

    checks.register(elsewhere)
    try:  # in this process: no supervisor forked inside the test run
        call_command("taskclaim_worker", "testapp.Document", "--burst", "--no-supervisor")
    finally:
        checks.registry.registry.registered_checks.discard(elsewhere)
    assert not Document.objects.exclude(status="done").exists()
