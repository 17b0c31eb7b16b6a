"""``singleton()`` refuses a non-bool ``xact`` when it decorates, whatever the backend."""

from __future__ import annotations

import pytest

from django_taskclaim import singleton


@pytest.mark.parametrize("backend", ["lease", "advisory"])
@pytest.mark.parametrize("xact", ["x", 0, 1, None, "False"])
def test_singleton_refuses_a_non_bool_xact_with_a_clear_type_error(backend, xact):
    with pytest.raises(TypeError, match=r"^singleton\(xact=\.\.\.\) is True or False, got ") as err:
        singleton("report", backend=backend, xact=xact)
    assert repr(xact) in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("xact", [True, False])
def test_singleton_accepts_a_bool_xact(xact):
    @singleton("report", backend="advisory", xact=xact)
    def job() -> str:
        return "ran"

    assert callable(job)
