"""The tables that declare each setting and each worker option once, against what is
derived from them: the docs, the command line and ``WorkerConfig`` (no database)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

from django_taskclaim.config.settings import (
    BOUNDS,
    DEFAULTS,
    NONE_ALLOWED,
    REMOVED,
    SETTINGS,
    TABLE,
    taskclaim_settings,
)
from django_taskclaim.worker.config import WorkerConfig
from django_taskclaim.worker.options import BY_NAME, OPTIONS, default, from_command_line

DOCS = Path(__file__).resolve().parents[2] / "docs"


def shown(value: object) -> str:
    """A default as docs/settings.md writes it."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def documented_settings() -> dict[str, set[str]]:
    """name -> the defaults docs/settings.md gives it, from every table row that starts
    with a ``TASKCLAIM_*`` setting."""
    found: dict[str, set[str]] = {}
    text = (DOCS / "settings.md").read_text()
    for name, value in re.findall(r"^\| `TASKCLAIM_(\w+)` \| `([^`]*)` \|", text, re.M):
        found.setdefault(name, set()).add(value)
    return found


def test_the_table_declares_each_setting_once_and_the_lookups_follow_it():
    names = [s.name for s in TABLE]
    assert len(names) == len(set(names))
    assert set(SETTINGS) | set(REMOVED) == set(names)
    assert not set(SETTINGS) & set(REMOVED)
    for name, setting in SETTINGS.items():
        assert DEFAULTS[name] == setting.default
        if setting.default is None:
            assert name in NONE_ALLOWED, name
        else:
            assert isinstance(setting.default, setting.kind), name
        if setting.bound is not None:
            assert BOUNDS[name] is setting.bound
            assert setting.bound.whole == (setting.kind is int), name
        assert getattr(taskclaim_settings, name) == DEFAULTS[name]  # tests set none
    with pytest.raises(AttributeError, match="unknown django-taskclaim setting"):
        _ = taskclaim_settings.WORKER_DEAD_AFTER


def test_docs_list_every_setting_with_its_default_and_nothing_else():
    documented = documented_settings()
    assert set(documented) == set(SETTINGS)
    for name, defaults in documented.items():
        assert defaults == {shown(DEFAULTS[name])}, name
    text = (DOCS / "settings.md").read_text()
    bounds_paragraph = text[text.index("**Bounds.**") :].split("\n\n")[0]
    for name in BOUNDS:
        assert f"`{name}`" in bounds_paragraph, name
    for name in REMOVED:
        assert f"TASKCLAIM_{name}`, which is removed" in text, name


def option_actions(command: BaseCommand) -> dict[str, object]:
    """dest -> argparse action of the command's own options (Django's left out)."""
    base = {a.dest for a in BaseCommand().create_parser("manage.py", "x")._actions}
    parser = command.create_parser("manage.py", "taskclaim_worker")
    return {a.dest: a for a in parser._actions if a.dest not in base and a.option_strings}


@pytest.mark.parametrize("name", ["taskclaim_worker", "worker"])
def test_the_worker_command_line_is_the_option_table(name):
    command = load_command_class("django_taskclaim", name)
    actions = option_actions(command)
    assert set(actions) == {o.dest for o in OPTIONS}
    for option in OPTIONS:
        action = actions[option.dest]
        assert tuple(action.option_strings) == option.flags
        assert action.help == option.help
        if option.kind is bool:
            assert (action.const, action.default, action.nargs) == (True, False, 0)
        else:
            assert action.default is None  # not given: WorkerConfig.build resolves it
            assert action.nargs is None
        assert type(action).__name__.startswith("_Append") == option.repeat


def test_workerconfig_has_a_field_per_option_with_its_default():
    fields = {f.name: f for f in dataclasses.fields(WorkerConfig)}
    assert set(fields) - {"models", "handlers", "strategies"} == set(BY_NAME)
    for name in BY_NAME:
        assert fields[name].default == default(name), name
    assert default("poll") == DEFAULTS["POLL_INTERVAL"]


def test_the_command_line_turns_switches_over_and_leaves_the_rest_unset():
    parser = load_command_class("django_taskclaim", "taskclaim_worker").create_parser(
        "manage.py", "taskclaim_worker"
    )
    given = from_command_line(vars(parser.parse_args(["--no-reap", "--burst", "-c", "3"])))
    assert given["reap"] is False
    assert given["burst"] is True
    assert given["concurrency"] == "3"
    assert given["scheduler"] is None
    assert given["lease"] is None
    assert "using" not in given  # --database goes to the fleet's plan


def test_docs_list_every_worker_option():
    text = (DOCS / "worker.md").read_text()
    table = text[text.index("## Options") :].split("\n\n")[1]
    flags = set()
    for row in table.splitlines()[2:]:
        first = row.split("|")[1]
        flags |= {m.split()[0] for m in re.findall(r"`(-[^`]+)`", first)}
    assert flags == {f for o in OPTIONS for f in o.flags} | {"-v"}
