"""No click in the admin starts an unbounded query (issue: "Show counts" ran for minutes).

On the real PostgreSQL with a large claimable table (and a large attempts table), analysed
so the planner sees their sizes, a walk of every link and form of the claimable changelist
(each filter choice, each sorting link, the pagination, the search, a facet link if one is
offered, the summary's links, the actions and their confirmation pages), the dashboard, the
worker pages and a row's change page: every SELECT each page sends is explained
(``EXPLAIN``, never run), and none may be planned as

- a sequential scan of a large table (:data:`LARGE`) that no ``Limit`` can stop early:
  one with no ``Limit`` above it, or with a node between them that reads all its input
  before it returns a row (a sort, an aggregate, a hash, ...): ``Limit → Sort → Seq
  Scan`` reads every row;
- a subquery run once per row (a non-hashed ``SubPlan``) of a node that is not bounded
  that way and reads a large table: quadratic in the rows.

Small tables (users, sessions, pauses, workers, ...) may be scanned: their size does not
grow with the queue's history. What Django itself sends for the listed rows and that only
an index of the user's model could bound (the page's rows sorted or filtered by a column
no index serves, the paginator's counts, an ``icontains`` search, the deletion
confirmation of "select all") is in :data:`KNOWN`, each with its reason; everything else
(the library's summary, charts, dashboard, worker pages, a row's attempts, the actions)
must be bounded.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape
from html.parser import HTMLParser
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_taskclaim.db import DbNow
from django_taskclaim.models import WorkerProcess
from tests.support.testapp.models import Document

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL plans"),
]

CHANGELIST = "admin:testapp_document_changelist"
#: Rows of the claimable table: above ops.figures.EXACT_UP_TO (a large table) and enough
#: for the planner to prefer an index wherever one serves.
ROWS = 120_000
#: The tables whose size grows with the history: a scan of one is unbounded.
LARGE = {"testapp_document", "taskclaim_taskattempt"}
#: Nodes that read all their input before they return a row: a ``Limit`` above one does
#: not stop the scan below it.
BLOCKING = {
    "Sort",
    "Incremental Sort",
    "Aggregate",
    "Hash",
    "Materialize",
    "SetOp",
    "WindowAgg",
}

#: Statements unbounded while no index of the user's model serves them (docs/admin.md,
#: "What a changelist costs"): (request pattern, statement pattern, reason). All but
#: the last are Django's own, for the listed rows.
KNOWN: list[tuple[str, str, str]] = [
    (
        r"^GET .*\?q=",
        r'^SELECT .* FROM "testapp_document" WHERE .*"title"::text\) LIKE UPPER',
        "an icontains search (search_fields = ['title']), the rows and their count",
    ),
    (
        r"",
        r'^SELECT COUNT\(\*\) AS "__count" FROM "testapp_document"',
        "Django's paginator counts the listed rows (and the table, for 'N total')",
    ),
    (
        r"^GET ",
        r'^SELECT "testapp_document"\."id", .* FROM "testapp_document" (WHERE .* )?ORDER BY ',
        "the page's rows, filtered or sorted by a column no index of the model serves",
    ),
    (
        r"^POST /admin/testapp/document/ .*select_across=1",
        r'^SELECT "testapp_document"\."status" AS "status", COUNT\(\*\) AS "n" FROM '
        r'"testapp_document" GROUP BY 1$',
        "an action over 'select all' of the whole list counts the rows per state for its "
        "message (its changes go in bounded batches)",
    ),
]


def _walk_plan(node: dict[str, Any], bounded: bool, found: list[str], text: str) -> bool:
    """Add to ``found`` the unbounded nodes of the plan under ``node``; ``bounded``: a
    ``Limit`` above it can stop it early. Returns whether the subtree reads a large table."""
    kind = node["Node Type"]
    if kind == "Limit":
        bounded = True
    elif kind in BLOCKING:
        bounded = False
    relation = node.get("Relation Name")
    large = relation in LARGE
    if kind == "Seq Scan" and large and not bounded:
        found.append(f"Seq Scan on {relation} with no Limit that stops it")
    subplans = []
    for child in node.get("Plans", []):
        if child.get("Parent Relationship") == "SubPlan":
            subplans.append(child)
        large |= _walk_plan(child, bounded, found, text)
    for sub in subplans:
        name = sub.get("Subplan Name", "")
        if f"hashed {name}" not in text and large and not bounded:
            found.append(f"{name} run per row of {kind} over a large table")
    return large


def unbounded(sql: str, params: Any) -> list[str]:
    """The unbounded nodes of ``sql``'s plan (``EXPLAIN``, not run)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (doc,) = cursor.fetchone()
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    found: list[str] = []
    _walk_plan(plan, False, found, json.dumps(plan))
    return found


def plan_text(sql: str, params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _is_select(sql: str) -> bool:
    head = sql.lstrip().upper()
    return head.startswith(("SELECT", "WITH")) and " FOR UPDATE" not in head


class Walk:
    """Sends requests as ``client`` and explains every SELECT they send."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.problems: list[str] = []
        self.known: dict[str, str] = {}
        self.pages = 0
        self.statements = 0
        self.posted: list[str] = []

    def _check(self, what: str, queries: list[dict[str, Any]]) -> None:
        self.pages += 1
        for query in queries:
            sql = query["sql"]
            if not _is_select(sql):
                continue
            self.statements += 1
            found = unbounded(sql, None)
            if not found:
                continue
            reason = next(
                (why for page, st, why in KNOWN if re.search(page, what) and re.search(st, sql)),
                None,
            )
            if reason is not None:
                self.known.setdefault(reason, f"{what}: {sql[:300]}\n{plan_text(sql, None)}")
                continue
            self.problems.append(
                f"{what}: {'; '.join(found)}\n  {sql[:600]}\n{plan_text(sql, None)}"
            )

    def get(self, url: str) -> str:
        """The page at ``url`` (its HTML; empty when a statement of it was cancelled)."""
        with CaptureQueriesContext(connection) as ctx:
            try:
                resp = self.client.get(url)
            except OperationalError as exc:  # statement_timeout: the plan says why
                self.problems.append(f"GET {url}: cancelled: {exc}")
                resp = None
        self._check(f"GET {url}", ctx.captured_queries)
        if resp is None:
            return ""
        assert resp.status_code in (200, 302), (url, resp.status_code)
        return resp.content.decode()

    def post(self, url: str, data: dict[str, Any]) -> Any:
        self.posted.append(url)
        with CaptureQueriesContext(connection) as ctx:
            resp = self.client.post(url, data)
        assert resp.status_code in (200, 302), (url, resp.status_code)
        what = f"POST {url} " + " ".join(
            f"{k}={v}" for k, v in sorted(data.items()) if k in ("action", "select_across", "op")
        )
        what += " " + " ".join(k for k in sorted(data) if k.startswith("taskclaim"))
        self._check(what, ctx.captured_queries)
        return resp


def links_of(html: str) -> set[str]:
    """The changelist's own links (``href="?…"``): filters, sorting, pages, facets, the
    summary's."""
    return {unescape(h) for h in re.findall(r'href="(\?[^"]*)"', html)}


class _Forms(HTMLParser):
    """The POST forms of a page: (action, fields, submit buttons as (name, value))."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str], list[tuple[str, str]]]] = []
        self._open = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._open = a.get("method", "").lower() == "post"
            if self._open:
                self.forms.append((a.get("action", ""), {}, []))
        elif self._open and tag in ("input", "button", "select"):
            _action, fields, buttons = self.forms[-1]
            kind = a.get("type", "submit" if tag == "button" else "text")
            if kind == "submit" and a.get("name"):
                buttons.append((a["name"], a.get("value", "")))
            elif a.get("name") and kind in ("hidden", "text"):
                fields[a["name"]] = a.get("value", "")
            elif tag == "select" and a.get("name"):
                fields[a["name"]] = ""  # its first option's value is filled below

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._open = False


def post_forms(html: str, page: str, *, only: str) -> list[tuple[str, dict[str, str]]]:
    """Each submit button of the POST forms of ``html`` whose action contains ``only``,
    as (url, data) to post."""
    parser = _Forms()
    parser.feed(html)
    options = dict(re.findall(r'<select name="([^"]+)"[^>]*>\s*<option value="([^"]*)"', html))
    out = []
    for action, fields, buttons in parser.forms:
        url = unescape(action) or page
        if only not in url:
            continue
        data = {k: options.get(k, v) if v == "" else v for k, v in fields.items()}
        for name, value in buttons:
            out.append((url, {**data, name: unescape(value)}))
    return out


def fill() -> None:
    """``ROWS`` rows: done, 5 % failed (interleaved, with an error), 200 ready (a few
    deferred), 20 processing (5 with an expired lease), no cancelled or waiting row;
    an attempt record per failed row and per done row; two live workers; then ANALYZE."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO testapp_document (status, version, locked_until, locked_by, attempts,
                run_after, priority, created_at, claimed_at, finished_at, last_error, title,
                kind, payload, result)
            SELECT CASE WHEN i %% 20 = 0 THEN 'failed' ELSE 'done' END, 2, NULL, 'w-old', 1,
                NULL, 0, now() - (i || ' seconds')::interval,
                now() - (i || ' seconds')::interval, now() - (i || ' seconds')::interval,
                CASE WHEN i %% 20 = 0 THEN 'ValueError: bad page ' || i ELSE '' END,
                'document ' || i, '', '{}', ''
            FROM generate_series(1, %s) AS i
            """,
            [ROWS],
        )
        cursor.execute(
            """
            INSERT INTO taskclaim_taskattempt (model, "row", number, worker, started_at,
                runtime, outcome, error)
            SELECT 'testapp.Document', id::text, 1, 'w-old', created_at, 0.5,
                CASE WHEN status = 'failed' THEN 'failed' ELSE 'done' END, last_error
            FROM testapp_document
            """
        )
    ready = Document.objects.bulk_create(Document(title=f"ready {i}") for i in range(200))
    Document.objects.filter(pk__in=[d.pk for d in ready[:10]]).update(
        run_after=DbNow() + _minutes(30)
    )
    held = Document.objects.bulk_create(Document(title=f"held {i}") for i in range(20))
    Document.objects.filter(pk__in=[d.pk for d in held]).update(
        status="processing", locked_by="w-1", locked_until=DbNow() + _minutes(5), attempts=1
    )
    Document.objects.filter(pk__in=[d.pk for d in held[:5]]).update(
        locked_until=DbNow() - _minutes(1)
    )
    # what the workers' heartbeats write as they finish rows (the charts read it)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO taskclaim_taskhistory (model, queue, minute, done, failed)
            SELECT 'testapp.Document', '',
                date_trunc('minute', now()) - (m || ' minutes')::interval, 57, 3
            FROM generate_series(0, 1439) AS m
            """
        )
    for n in (1, 2):
        WorkerProcess.objects.create(
            worker_id=f"host:{n}:w-{n}",
            hostname="host",
            pid=n,
            model_labels=["testapp.Document"],
            concurrency=4,
            in_flight=1,
            last_seen=DbNow(),
            started_at=DbNow(),
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE testapp_document")
        cursor.execute("ANALYZE taskclaim_taskattempt")
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'testapp_document'::regclass")
        (estimated,) = cursor.fetchone()
    assert estimated > ROWS * 0.9  # the planner sees the real size


def _minutes(n: int) -> timedelta:
    return timedelta(minutes=n)


@pytest.mark.slow
def test_every_link_and_form_of_the_admin_is_bounded(admin_client) -> None:
    fill()
    rows = [
        Document.objects.filter(status=state).order_by("pk").values_list("pk", flat=True)[0]
        for state in ("failed", "processing", "ready")
    ]
    walk = Walk(admin_client)
    base = reverse(CHANGELIST)
    with connection.cursor() as cursor:
        # a page that never answers fails the test rather than holding it (the facets'
        # count ran for minutes on this table): its statement is cancelled, and explained
        cursor.execute("SET statement_timeout = '30s'")
    html = walk.get(base)
    # the summary's estimates invent no row: none is cancelled, none waits
    assert 'data-state="cancelled" data-count="0"' in html
    assert 'data-state="waiting" data-count="0"' in html
    links = links_of(html)
    # the changelist's links: filters, sorting, pages, the summary, a facet link if any
    assert any("taskclaim_status=failed" in link for link in links), sorted(links)
    assert any(link.startswith("?o=") for link in links), sorted(links)
    assert any("p=" in link for link in links), sorted(links)
    seen = set(links)
    for link in sorted(links):
        page = walk.get(base + link)
        if "taskclaim_" in link:  # a filter's choice: its own pages too (the last one)
            for more in sorted(links_of(page) - seen):
                if "p=" in more:
                    seen.add(more)
                    walk.get(base + more)
    walk.get(f"{base}?q=document+4242")
    walk.get(f"{base}?q=4242")
    # a row's change page: a failed row (error, attempts), a held one, a ready one; and
    # its buttons (Retry, Requeue, Cancel, ... as the row's state offers them)
    pages = {pk: reverse("admin:testapp_document_change", args=(pk,)) for pk in rows}
    forms = []
    for pk, url in pages.items():
        forms += post_forms(walk.get(url), url, only="/taskclaim/")
        walk.get(reverse("admin:testapp_document_history", args=(pk,)))
    assert forms
    for url, data in forms:
        walk.post(url, data)
    # the changelist's pause form (pause, then resume)
    pause_forms = post_forms(walk.get(base), base, only="pause")
    assert pause_forms
    for url, data in sorted(pause_forms, key=lambda f: f[1].get("op") != "pause"):
        walk.post(url, data)
    # the actions: over the visible page (a deletion: its confirmation page), and over
    # "select all" of the whole list and of a filter an index serves
    visible = list(Document.objects.order_by("-pk").values_list("pk", flat=True)[:100])
    for action in (
        "taskclaim_requeue",
        "taskclaim_retry_failed",
        "taskclaim_release",
        "taskclaim_reap",
        "taskclaim_cancel",
        "delete_selected",
    ):
        data = {"action": action, "index": 0, "select_across": "0", "_selected_action": visible}
        walk.post(base, data)
        if action == "delete_selected":
            continue
        data.update(select_across="1", _selected_action=visible[:1])
        walk.post(f"{base}?taskclaim_status=ready", data)
        if action == "taskclaim_release":  # legal for the held rows only: a walk of all
            walk.post(base, data)
    # the dashboard and its pause forms, the worker pages
    dashboard = reverse("admin:taskclaim_dashboard")
    for url, data in post_forms(walk.get(dashboard), dashboard, only="pause"):
        walk.post(url, data)
    workers = reverse("admin:taskclaim_workerprocess_changelist")
    for link in sorted(links_of(walk.get(workers))):
        walk.get(workers + link)
    for worker in WorkerProcess.objects.all():
        walk.get(reverse("admin:taskclaim_workerprocess_change", args=(worker.pk,)))
    first = WorkerProcess.objects.order_by("pk").values_list("pk", flat=True)[:1]
    for across in ("0", "1"):
        data = {"action": "stop_workers", "index": 0, "select_across": across}
        walk.post(workers, {**data, "_selected_action": list(first)})
    with connection.cursor() as cursor:
        cursor.execute("RESET statement_timeout")
    assert walk.pages > 40
    assert walk.statements > 100
    assert not walk.problems, "\n\n".join(walk.problems)
    print(f"\n\n{walk.pages} pages, {walk.statements} SELECTs explained; posted: {walk.posted}")
    print("known, unbounded without an index of the model:")
    for reason, example in walk.known.items():
        print(f"- {reason}\n{example}\n")
