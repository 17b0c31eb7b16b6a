"""System checks: stable ids, clear hints."""

from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from django_taskclaim.checks.core import check_models, check_settings
from django_taskclaim.config.options import _cache
from tests.support.testapp.models import Document


def ids(messages):
    return sorted(m.id for m in messages)


@pytest.mark.django_db
def test_clean_project_has_no_errors():
    errors = [m for m in checks.run_checks() if m.id and m.id.startswith("taskclaim")]
    assert errors == []


@override_settings(TASKCLAIM_LEASEE=10)
def test_unknown_setting_with_suggestion():
    (msg,) = [m for m in check_settings() if m.id == "taskclaim.E001"]
    assert "TASKCLAIM_LEASEE" in msg.msg
    assert msg.hint == "Did you mean TASKCLAIM_LEASE?"


@override_settings(TASKCLAIM_POOLER_MODE="statement")
def test_bad_pooler_mode():
    assert "taskclaim.E004" in ids(check_settings())


@pytest.mark.parametrize("value", ["error", "", None, True])
def test_bad_attempt_log(value):
    with override_settings(TASKCLAIM_ATTEMPT_LOG=value):
        assert "taskclaim.E009" in ids(check_settings())
    assert "taskclaim.E009" not in ids(check_settings())


def test_sqlite_without_immediate_warns(monkeypatch):
    from types import SimpleNamespace

    from django_taskclaim.checks import core as module

    fake = SimpleNamespace(
        DATABASES={"other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    )
    monkeypatch.setattr(module, "settings", fake)
    (msg,) = [m for m in check_settings() if m.id == "taskclaim.W002"]
    assert "'other'" in msg.msg


@override_settings(TASKCLAIM_STRATEGY="warp")
@pytest.mark.django_db
def test_bad_strategy_setting():
    msgs = [m for m in check_models() if m.id == "taskclaim.E002"]
    assert any("strategy 'warp' is unknown" in m.msg for m in msgs)


@override_settings(TASKCLAIM_MAX_ATTEMPTS=0)
def test_bad_max_attempts_setting():
    assert any("max_attempts" in m.msg for m in check_models() if m.id == "taskclaim.E002")


@pytest.mark.parametrize(
    ("jitter", "says"),
    [(1.5, "must be from 0 to 1"), (-0.1, "must be >= 0"), ("lots", "must be a number")],
)
def test_bad_retry_jitter_setting(jitter, says):
    with override_settings(TASKCLAIM_RETRY_JITTER=jitter):
        msgs = [m.msg for m in check_models() if m.id == "taskclaim.E002"]
    assert any(f"retry_jitter {says}" in m for m in msgs)


@pytest.mark.django_db
def test_unsupported_strategy_for_vendor():
    from django.db import connection

    if connection.vendor == "postgresql":
        pytest.skip("every strategy is supported on PostgreSQL")
    with override_settings(TASKCLAIM_STRATEGY="advisory"):
        assert "taskclaim.E003" in ids(check_models())


def test_bad_claim_meta_reported(monkeypatch):
    class ClaimMeta:
        lease = 30
        leese = 10

    monkeypatch.setattr(Document, "ClaimMeta", ClaimMeta)
    _cache.pop(Document, None)
    try:
        msgs = [m for m in check_models() if m.id == "taskclaim.E002"]
        assert any("unknown option(s) leese" in m.msg for m in msgs)
    finally:
        _cache.pop(Document, None)


def test_missing_handler_and_index_warn(monkeypatch):
    class ClaimMeta:
        handler = "no_such_method"

    monkeypatch.setattr(Document, "ClaimMeta", ClaimMeta)
    monkeypatch.setattr(Document._meta, "indexes", [])
    _cache.pop(Document, None)
    try:
        assert {"taskclaim.W001", "taskclaim.W004"} <= set(ids(check_models()))
    finally:
        _cache.pop(Document, None)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TASKCLAIM_LEASE", 0),
        ("TASKCLAIM_LEASE", float("inf")),
        ("TASKCLAIM_LEASE", 1e300),
        ("TASKCLAIM_MAX_ATTEMPTS", 0),
        ("TASKCLAIM_REAP_BATCH", 10**12),
        ("TASKCLAIM_POLL_INTERVAL", float("nan")),
        ("TASKCLAIM_HEARTBEAT_INTERVAL", -1),
        ("TASKCLAIM_WORKER_SILENT_AFTER", "soon"),
    ],
)
def test_numeric_settings_out_of_bounds_are_errors(name, value):
    with override_settings(**{name: value}):
        msgs = [m for m in check_settings() if m.id == "taskclaim.E005"]
    assert len(msgs) == 1
    assert name in msgs[0].msg
    assert "from" in msgs[0].hint


@override_settings(TASKCLAIM_HEARTBEAT_INTERVAL=150, TASKCLAIM_LEASE=300)
def test_heartbeat_that_cannot_keep_the_lease_alive_is_an_error():
    _cache.clear()
    try:
        msgs = [m for m in check_models() if m.id == "taskclaim.E006"]
    finally:
        _cache.clear()
    assert any(m.obj is Document for m in msgs)
    assert "not under half the lease" in msgs[0].msg


@override_settings(TASKCLAIM_HEARTBEAT_INTERVAL=None, TASKCLAIM_LEASE=300)
def test_default_heartbeat_a_third_of_each_lease_passes():
    _cache.clear()
    try:
        assert not [m for m in check_models() if m.id == "taskclaim.E006"]
    finally:
        _cache.clear()


@override_settings(TASKCLAIM_WORKER_DEAD_AFTER=60)
def test_removed_setting_is_an_error_saying_why():
    (msg,) = [m for m in check_settings() if m.id == "taskclaim.E007"]
    assert "TASKCLAIM_WORKER_DEAD_AFTER" in msg.msg
    assert "SILENT" in msg.hint or "silent" in msg.hint
