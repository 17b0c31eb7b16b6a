"""The protocol, checked by Spin: claim, lease, heartbeat, fence, settle and reap.

``protocol/taskclaim.pml`` models the statements the code sends (3 workers, each with its
claimer, executor, heartbeat and ack writer; a supervisor, a reaper, an operator who
cancels, requeues and holds row locks; kills and pauses at any step). Spin must find that
every property holds, and must reject each broken design we know with a counterexample
trail, so the checker itself is tested. ``protocol/actions.json`` ties every model action
to the function and statement that implement it: a name that leaves the code fails here.

The model does not depend on the database: it is checked once, in the SQLite pass.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "taskclaim_protocol_check", ROOT / "protocol" / "check.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check = _load_checker()

pytestmark = pytest.mark.skipif(
    getattr(settings, "DB_VENDOR", "sqlite") != "sqlite",
    reason="the protocol model does not depend on the database: checked in the SQLite pass",
)

HOLDS = [run for run in check.RUNS if run.expect_violation is None]
BROKEN = [run for run in check.RUNS if run.expect_violation is not None]


def _needs_spin() -> None:
    why = check.missing_tools()
    if why:
        pytest.skip(why)


# -- the model is tied to the code ----------------------------------------------------


def test_every_model_action_is_in_the_table_and_back():
    labels = {entry["label"] for entry in check.load_actions()}
    assert check.model_labels() == labels


def test_every_function_and_statement_the_table_names_exists_in_the_code():
    assert check.missing_names(check.load_actions()) == []


def test_a_name_that_left_the_code_fails_the_check():
    entries = [
        {"label": "A_x", "step": "", "function": "django_taskclaim.recovery.reap:reap_gone"},
        {"label": "A_y", "step": "", "function": "django_taskclaim.nowhere:reap"},
        {
            "label": "A_z",
            "step": "",
            "function": "django_taskclaim.recovery.reap:reap_queryset",
            "statement": "postgresql.PostgreSQL.reap_gone",
        },
        {
            "label": "A_w",
            "step": "",
            "function": "django_taskclaim.recovery.reap:reap_queryset",
            "orm": "base.filter(pk=pk).update(",
        },
        {"label": "A_v", "step": "", "outside": "the operating system"},
    ]
    problems = check.missing_names(entries)
    assert [p.split(":")[0] for p in problems] == ["A_x", "A_y", "A_z", "A_w"]
    assert "reap_gone" in problems[0]
    assert "no longer contains" in problems[3]


def test_every_broken_design_of_the_model_is_a_run_and_back():
    """A WITNESS_ variant the model has but no run uses would never be checked; a run
    naming one the model lacks would check the correct model under a wrong name."""
    for model, count in ((check.MODEL, 10), (check.FAN_IN_MODEL, 2)):
        in_model = set(re.findall(r"\bWITNESS_[A-Z_]+", model.read_text()))
        runs = [run for run in BROKEN if run.model == model]
        in_runs = {name for run in runs for name in run.defines if name.startswith("WITNESS_")}
        assert in_runs == in_model, model.name
        assert len(runs) == len(in_model) == count, model.name


def test_every_action_names_tests_of_its_effect_that_exist():
    """Quoted code shows where an action is; only a test of its effect fails when the
    code keeps the quote and stops doing what the model says."""
    actions = check.load_actions()
    assert all(entry.get("tests") for entry in actions)
    assert check.missing_tests(actions) == []


def test_a_test_that_left_the_suite_fails_the_check():
    here = "tests/guarantees/test_protocol.py"
    entries = [
        {"label": "A_x", "step": "", "tests": []},
        {"label": "A_y", "step": "", "tests": ["tests/nowhere/test_gone.py::test_x"]},
        {"label": "A_z", "step": "", "tests": [f"{here}::test_gone"]},
        {"label": "A_w", "step": "", "tests": [f"{here}::test_gone[param]"]},
        {"label": "A_u", "step": ""},
        {"label": "A_v", "step": "", "tests": [f"{here}::test_the_protocol_holds[safety]"]},
    ]
    problems = check.missing_tests(entries)
    assert [p.split(":")[0] for p in problems] == ["A_x", "A_y", "A_z", "A_w", "A_u"]
    assert "not found" in problems[1]
    assert "test_gone" in problems[2]


def test_the_docs_show_the_table_as_it_is():
    page = (ROOT / "docs" / "protocol.md").read_text()
    assert check.render_table(check.load_actions()) in page


def test_pan_reports_are_read_as_the_property_they_break():
    seen = check.violated_property
    assert seen("pan:1: assertion violated 0 (at depth 9)") == check.ONE_HOLDER
    assert seen("pan:1: assertion violated (ghost[0]<0) (at depth 9)") == check.NO_EARLY_RERUN
    assert seen("pan:1: assertion violated (effect[1]<=1) (at depth 9)") == check.EXACTLY_ONCE
    assert seen("pan:1: assertion violated ((mt[0]==tok[0])) (at depth 9)") == check.FENCED
    assert seen("pan:1: assertion violated ((!(alive[0]))) (at depth 9)") == check.RENEWALS
    assert seen("pan:1: acceptance cycle (at depth 9)") == check.NO_LOSS
    assert seen("pan:1: invalid end state (at depth 9)") == "DEADLOCK"
    assert seen("pan:1: assertion violated (released<=1) (at depth 9)") == check.CALLBACK_ONCE
    assert seen("pan:1: assertion violated (nsettled==2) (at depth 9)") == check.NEVER_EARLY
    assert seen("pan:1: assertion violated (released==1) (at depth 9)") == check.NEVER_STUCK
    assert seen("\tinvalid end states\t+\n\tassertion violations\t+\nerrors: 0") is None


# -- Spin ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("run", HOLDS, ids=[run.name for run in HOLDS])
def test_the_protocol_holds(run):
    _needs_spin()
    result = check.check(run)
    assert result.ok, f"{run.name} ({run.about}): {result.detail}\n" + "\n".join(result.trail[-60:])
    assert result.states > 1000  # the search ran (an empty model proves nothing)


@pytest.mark.parametrize("run", BROKEN, ids=[run.name for run in BROKEN])
def test_each_broken_design_is_rejected_with_a_trail(run):
    _needs_spin()
    result = check.check(run)
    assert result.violated == run.expect_violation, f"{run.about}: {result.detail}"
    assert result.trail, "no counterexample trail"
