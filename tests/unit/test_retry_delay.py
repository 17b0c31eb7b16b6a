"""``Retry(delay=…)`` checks its delay itself (``exceptions`` sits below ``config.bounds``):
the same range and the same words as every other bounded option."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_taskclaim.config import bounds
from django_taskclaim.exceptions import RETRY_DELAY_MAX, Retry

BAD = [1e20, float("inf"), float("nan"), -1, -0.5, True, "5", None.__class__, timedelta(days=400)]


def test_the_range_is_the_bounds_range():
    assert (bounds.RETRY_DELAY.low, bounds.RETRY_DELAY.high) == (0.0, RETRY_DELAY_MAX)


@pytest.mark.parametrize("delay", BAD, ids=repr)
def test_refused_alike(delay):
    with pytest.raises(ValueError) as by_bounds:
        bounds.number(delay, "Retry delay", bounds.RETRY_DELAY, seconds=True, error=ValueError)
    with pytest.raises(ValueError) as by_retry:
        Retry(delay=delay)
    assert str(by_retry.value) == str(by_bounds.value)


@pytest.mark.parametrize("delay", [0, 0.25, 3600, timedelta(hours=2), RETRY_DELAY_MAX])
def test_accepted_alike(delay):
    expected = bounds.number(delay, "Retry delay", bounds.RETRY_DELAY, seconds=True)
    assert Retry(delay=delay).delay == expected
