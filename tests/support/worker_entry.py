"""Entry point of worker subprocesses in tests: ``python -m tests.support.worker_entry CMD ARGS``.

Runs the management command ``CMD`` exactly as ``manage.py`` would, after applying
test-only knobs from the environment (settings are read live, ``ClaimMeta`` options at
first use):

- ``TASKCLAIM_T_SETTINGS``: JSON object of settings to override, e.g.
  ``{"TASKCLAIM_REAP_INTERVAL": 0.5}``;
- ``TASKCLAIM_T_CLAIMMETA``: JSON object of ``Document.ClaimMeta`` options, e.g.
  ``{"max_attempts": 3, "handler": "tests.support.worker_handlers.process_atomic"}``;
- ``TASKCLAIM_T_CLAIMMETA_MODEL``: the model those options are for instead of
  ``testapp.Document``, e.g. ``keyedapp.PairJob``.
"""

from __future__ import annotations

import json
import os
import sys

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    from django.conf import settings

    for name, value in json.loads(os.environ.get("TASKCLAIM_T_SETTINGS", "{}")).items():
        setattr(settings, name, value)
    from django.apps import apps

    model = apps.get_model(os.environ.get("TASKCLAIM_T_CLAIMMETA_MODEL", "testapp.Document"))
    meta = json.loads(os.environ.get("TASKCLAIM_T_CLAIMMETA", "{}"))
    for name, value in meta.items():
        setattr(model.ClaimMeta, name, value)
    if meta:
        from django_taskclaim.config import options

        options._cache.pop(model, None)  # resolved at startup (admin); resolve again
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
