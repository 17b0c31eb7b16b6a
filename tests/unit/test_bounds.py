"""The one table of numeric bounds and its validator (pure logic: no database)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.core.management.base import CommandError

from django_taskclaim.config import bounds
from django_taskclaim.config.settings import BOUNDS, DEFAULTS, setting_problem
from django_taskclaim.exceptions import ConfigurationError
from django_taskclaim.management.commands import reaper
from django_taskclaim.worker.options import BY_NAME, OPTIONS

ALL = [
    *(("setting " + k, b) for k, b in BOUNDS.items()),
    *(("worker " + o.flag, o.bound) for o in OPTIONS if o.bound is not None),
    *(("reap " + o.flag, o.bound) for o in reaper.OPTIONS if o.bound is not None),
    ("lock ttl", bounds.LOCK_TTL),
]


@pytest.mark.parametrize(("where", "bound"), ALL, ids=[w for w, _ in ALL])
def test_every_bound_is_finite_and_refuses_what_lies_outside(where, bound):
    assert math.isfinite(bound.low)
    assert math.isfinite(bound.high)
    assert bound.low <= bound.high
    assert bounds.number(bound.low, "x", bound) == bound.low
    assert bounds.number(bound.high, "x", bound) == bound.high
    bad = [True, None, "1", [1], math.nan, math.inf, -math.inf, bound.high * 2 + 1]
    if bound.low > 0:
        bad += [0, -1]
    if bound.whole:
        bad.append(bound.low + 0.5)
    for value in bad:
        with pytest.raises(ConfigurationError) as info:
            bounds.number(value, "--opt", bound)
        assert str(info.value).startswith("--opt must be ")
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(("where", "bound"), ALL, ids=[w for w, _ in ALL])
def test_a_number_within_its_bound_comes_back_as_its_kind(where, bound):
    """An ``int`` within a whole bound comes back as itself; any number within a bound
    of fractions as a ``float`` (what every caller stores and compares)."""
    for value in (bound.low, bound.high, int(bound.high) if bound.high >= 1 else bound.low):
        got = bounds.number(value, "x", bound)
        assert got == value
        assert type(got) is (int if bound.whole else float)
    if not bound.whole and bound.low <= 1 <= bound.high:
        assert type(bounds.number(1, "x", bound)) is float


def test_parse_accepts_text_and_names_the_fix():
    whole = BY_NAME["batch"].bound
    assert bounds.number("7", "--batch", whole, parse=True) == 7
    for text, message in [
        ("1e20", "--batch must be a whole number, got '1e20'"),
        ("many", "--batch must be a whole number, got 'many'"),
        ("0", "--batch must be > 0, got '0'"),
        ("100000000", "--batch must be from 1 to 10000, got '100000000'"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            bounds.number(text, "--batch", whole, parse=True)
    seconds = BY_NAME["ack_window"].bound
    assert bounds.number("0", "--ack-window", seconds, parse=True) == 0.0
    with pytest.raises(ConfigurationError, match="--ack-window must be a finite number"):
        bounds.number("nan", "--ack-window", seconds, parse=True)
    with pytest.raises(ConfigurationError, match="--ack-window must be >= 0"):
        bounds.number("-1", "--ack-window", seconds, parse=True)


def test_seconds_accept_a_timedelta_and_the_error_class_is_the_callers():
    assert bounds.number(timedelta(minutes=2), "lease", bounds.LEASE, seconds=True) == 120.0
    with pytest.raises(ConfigurationError, match="lease must be a number, got"):
        bounds.number(timedelta(minutes=2), "lease", bounds.LEASE)
    with pytest.raises(ConfigurationError, match="lease must be a number of seconds, got 'x'"):
        bounds.number("x", "lease", bounds.LEASE, seconds=True)
    with pytest.raises(CommandError, match=r"--interval must be from 0\.1 to 86400"):
        bounds.number(
            "1e12", "--interval", reaper.BY_NAME["interval"].bound, parse=True, error=CommandError
        )


def test_the_numeric_settings_are_exactly_the_bounded_ones():
    numeric = {
        k for k, v in DEFAULTS.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    assert numeric | {"HEARTBEAT_INTERVAL", "TIMEOUT", "TIMEOUT_GRACE"} == set(BOUNDS)
    for name, bound in BOUNDS.items():
        if DEFAULTS[name] is not None:
            assert setting_problem(name, DEFAULTS[name]) is None, name
            assert isinstance(DEFAULTS[name], int) or not bound.whole, name
    assert setting_problem("HEARTBEAT_INTERVAL", None) is None
    assert "must be from" in (setting_problem("LEASE", 1e12) or "")


def test_the_worker_and_the_settings_agree_where_they_share_an_option():
    # The defaults a worker falls back to must pass the worker's own bounds.
    fallbacks = [o for o in OPTIONS if o.setting is not None]
    assert {o.name for o in fallbacks} == {"poll", "ack_window"}
    for option in fallbacks:
        w, s = option.bound, BOUNDS[option.setting]
        assert w is not None
        assert w.low <= s.low, option.flag
        assert s.high <= w.high, option.flag
    lease = BY_NAME["lease"].bound
    assert lease is not None
    assert lease.high == bounds.LEASE.high == bounds.LOCK_TTL.high


def test_claim_options_are_kept_per_model_and_dropped_when_a_setting_changes():
    from django.test import override_settings

    from django_taskclaim.config.options import get_options
    from tests.support.testapp.models import Document

    assert not hasattr(Document.ClaimMeta, "max_attempts")  # it follows the setting
    opts = get_options(Document)
    assert get_options(Document) is opts  # built once
    first = opts.max_attempts
    with override_settings(TASKCLAIM_MAX_ATTEMPTS=first + 7):
        assert get_options(Document) is not opts
        assert get_options(Document).max_attempts == first + 7
    assert get_options(Document).max_attempts == first
    with override_settings(TASKCLAIM_RETRY_JITTER="x"):
        for _ in range(2):  # an invalid option is never kept: it raises on every use
            with pytest.raises(ConfigurationError, match="retry_jitter must be a number"):
                get_options(Document).backoff(1)
    assert get_options(Document).backoff(1) >= 0


def test_retry_delays_are_bounded_with_a_clear_message():
    from django_taskclaim.exceptions import Retry

    assert Retry(delay=timedelta(hours=1)).delay == 3600.0
    for delay in (1e20, float("inf"), -1, True):
        with pytest.raises(ValueError, match="Retry delay must be"):
            Retry(delay=delay)
