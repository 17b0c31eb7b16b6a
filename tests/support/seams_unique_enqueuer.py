"""Child process for the unique-enqueue race: ``enqueue_unique()`` inside the caller's
``transaction.atomic()``, many times on a few keys, while rows holding them finish.

Usage: ``python tests/support/seams_unique_enqueuer.py CALLS KEYS GO_FILE``. Prints one JSON line:
``{"calls": [[key, pk, created], …], "errors": ["…", …]}``.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import django


def main() -> None:
    calls, keys, go_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    from django.db import DatabaseError, transaction

    from django_taskclaim.db import retry_transient
    from django_taskclaim.model.unique_insert import UniqueKeyRaceError
    from tests.support.helpers import wait_for
    from tests.support.uniqueapp.models import Export

    Path(f"{go_file}.ready.{os.getpid()}").touch()
    wait_for(Path(go_file).exists, timeout=90, interval=0.005, what="the go signal")
    done: list[list[object]] = []
    errors: list[str] = []
    named: list[str] = []
    for i in range(calls):
        key = f"k{random.randrange(keys)}"
        try:
            with transaction.atomic():
                row, created = Export.objects.enqueue_unique(dedupe_key=key, payload=f"p{i}")
        except UniqueKeyRaceError as exc:  # the documented, named give-up
            named.append(str(exc))
            continue
        except DatabaseError as exc:
            errors.append(f"{type(exc).__name__}: {exc} (during: {exc.__context__!r})")
            continue
        done.append([key, row.pk, created])
        if random.random() < 0.3:  # the row finishes, as a worker's write would (retried)
            retry_transient(
                lambda pk=row.pk: Export.objects.filter(pk=pk, status="ready").update(
                    status="done"
                ),
                "default",
                what="finish",
            )
    print(json.dumps({"calls": done, "errors": errors, "named": named}), flush=True)


if __name__ == "__main__":
    main()
