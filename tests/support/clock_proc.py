"""Run by test_clock.py under libfaketime: claim, extend, retry and reap with a skewed clock.

Prints one JSON line: the process's own clock minus the database's (to prove the skew
is real) and the pks it claimed/retried.
"""

from __future__ import annotations

import json
import os
import time

import django

from django_taskclaim.db import DbNow


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()

    from django_taskclaim import reap
    from tests.support.testapp.models import Document

    db_now = Document.objects.annotate(now=DbNow()).values_list("now", flat=True)[:1].get()
    skew = time.time() - db_now.timestamp()
    rows = Document.objects.claim(3, lease=30)
    rows[0].extend_lease(120)
    rows[1].retry(delay=60)
    reaped = reap(Document).total
    print(json.dumps({"skew": skew, "claimed": [r.pk for r in rows], "reaped": reaped}))


if __name__ == "__main__":
    main()
