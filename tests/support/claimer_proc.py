"""A claimer process for the ONE HOLDER tests: ``python -m tests.support.claimer_proc ...``.

Waits for the ``--go`` file (a cross-process barrier), then claims until no claimable
row is left, appending one JSON line per claimed row to ``--out``:
``{"pk": .., "token": .., "n": asked, "got": returned}``. ``--recipe`` runs one of the
well-known broken recipes instead of a library strategy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import django


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="auto")
    p.add_argument("--recipe", default="")
    p.add_argument("--batch-max", type=int, default=10)
    p.add_argument("--go", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="Document")
    p.add_argument("--claim-gate", type=int, default=None, help="TASKCLAIM_CLAIM_GATE (0: None)")
    args = p.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    django.setup()
    if args.claim_gate is not None:
        from django.conf import settings

        settings.TASKCLAIM_CLAIM_GATE = args.claim_gate or None
    from django.db import DatabaseError, connection

    from tests.support.testapp import models

    model = getattr(models, args.model)
    from tests.support.helpers import wait_for

    try:  # barrier: all children start claiming together
        wait_for(lambda: os.path.exists(args.go), timeout=60, interval=0.005, what="go")
    except AssertionError:
        return 3
    me = f"p{os.getpid()}"
    errors = 0
    out = []
    while True:
        n = random.randint(1, args.batch_max)
        try:
            if args.recipe:
                rows = RECIPES[args.recipe](model, n, me)
            elif args.strategy == "hold":
                from django.db import transaction

                with transaction.atomic():
                    rows = [
                        (r.pk, r.version)
                        for r in model.objects.claim(n, strategy="hold", worker=me)
                    ]
            else:
                rows = [
                    (r.pk, r.version)
                    for r in model.objects.claim(n, strategy=args.strategy, worker=me)
                ]
        except DatabaseError:
            errors += 1
            if errors > 500:
                raise
            continue
        if len(rows) > n:
            out.append({"pk": None, "token": None, "n": n, "got": len(rows)})
        for pk, token in rows:
            out.append({"pk": pk, "token": token, "n": n, "got": len(rows)})
        if not rows and not model.objects.claimable().exists():
            break
    with open(args.out, "w") as fh:
        for line in out:
            fh.write(json.dumps(line) + "\n")
        fh.write(json.dumps({"errors": errors}) + "\n")
    connection.close()
    return 0


def naive_lock_table(model, n, me):
    """Write skew: plain SELECT at READ COMMITTED, then INSERT a lock row of ids."""
    from django.db import transaction

    from tests.support.testapp.models import NaiveLock

    with transaction.atomic():
        taken = {i for ids in NaiveLock.objects.values_list("ids", flat=True) for i in ids}
        ids = [
            pk
            for pk in model.objects.filter(status="ready")
            .order_by("pk")
            .values_list("pk", flat=True)[: n + len(taken)]
            if pk not in taken
        ][:n]
        if not ids:
            return []
        NaiveLock.objects.create(owner=me, ids=ids)
        model.objects.filter(pk__in=ids).update(status="processing", locked_by=me)
    return [(pk, 0) for pk in ids]


def for_update_unconditional(model, n, me):
    """A common bug: candidates by plain SELECT, then SELECT … FOR UPDATE by id and an
    unconditional status UPDATE (no re-check once the lock is granted)."""
    from django.db import transaction

    ids = list(model.objects.filter(status="ready").order_by("pk").values_list("pk", flat=True)[:n])
    got = []
    for pk in ids:
        with transaction.atomic():
            list(model.objects.select_for_update().filter(pk=pk).values_list("pk", flat=True))
            model.objects.filter(pk=pk).update(status="processing", locked_by=me)
        got.append((pk, 0))
    return got


RECIPES = {
    "naive_lock_table": naive_lock_table,
    "for_update_unconditional": for_update_unconditional,
}

if __name__ == "__main__":
    sys.exit(main())
