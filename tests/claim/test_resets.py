"""The table of which optional fields each state change writes (``claim/resets.py``):
complete, only optional fields, the same as docs/architecture.md shows, and what its
readers derive from it for a model (with and without the fields, with ``db_column``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection
from django.db.models.functions import Concat

from django_taskclaim.backends import for_vendor
from django_taskclaim.backends.base import WRITE_CLEAR, WRITE_CLOCK, WRITE_HOLDER
from django_taskclaim.claim.base import claim_columns
from django_taskclaim.claim.resets import (
    RESETS,
    Change,
    Write,
    apply_in_memory,
    holder_text,
    in_line_field,
    plan,
    writes,
)
from django_taskclaim.config.claim_meta import OPTIONAL_FIELDS
from django_taskclaim.config.options import get_options
from django_taskclaim.db import DbNow
from tests.support.testapp.models import ColumnTask, Document, Job, NullableOrderTask

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
WORDS = {
    Write.HOLDER: "the worker",
    Write.CLOCK: "clock",
    Write.CLEAR: "cleared",
    Write.ERROR: "error text",
    Write.DUE: "clock + delay",
    Write.IN_LINE: "due time",
}


def test_every_change_has_a_row_of_optional_fields_only():
    assert set(RESETS) == set(Change)
    for row in RESETS.values():
        assert set(row) <= set(OPTIONAL_FIELDS)


def test_the_statement_writes_are_the_backends_names():
    assert (Write.HOLDER, Write.CLOCK, Write.CLEAR) == (WRITE_HOLDER, WRITE_CLOCK, WRITE_CLEAR)


def test_the_docs_show_the_table():
    text = DOCS.read_text()
    header = re.search(r"^\| state change \|(.*)\|$", text, re.MULTILINE)
    assert header is not None
    fields = [f.strip().strip("`") for f in header.group(1).split("|")]
    written = {f for row in RESETS.values() for f in row}
    assert set(fields) == written
    for change, row in RESETS.items():
        cells = " | ".join(WORDS[row[f]] if f in row else "kept" for f in fields)
        assert f"| `{change.name}` | {cells} |" in text


def test_writes_follow_the_table_for_the_fields_a_model_has():
    opts = get_options(Document)
    claim = writes(opts, Change.CLAIM, holder="w1")
    assert list(claim) == ["locked_by", "claimed_at"]
    assert claim["locked_by"] == "w1"
    assert isinstance(claim["claimed_at"], DbNow)
    assert list(writes(opts, Change.FAIL, error="boom")) == ["finished_at", "last_error"]
    assert isinstance(writes(opts, Change.COMPLETE)["finished_at"], DbNow)
    assert writes(opts, Change.REQUEUE)["finished_at"] is None
    assert writes(opts, Change.REQUEUE)["claimed_at"] is None
    retried = writes(opts, Change.RETRY, delay=0)
    assert list(retried) == ["run_after"]  # no error: kept; its place in line: kept
    assert retried["run_after"] is None  # due now
    snoozed = writes(opts, Change.SNOOZE, delay=0)
    assert isinstance(snoozed["created_at"], DbNow)  # in line from when it is due
    assert not isinstance(writes(opts, Change.SNOOZE, delay=5)["created_at"], DbNow)  # + 5 s
    assert "last_error" in writes(opts, Change.RETRY, error="x", delay=3)
    assert writes(opts, Change.GIVE_BACK) == {}
    job = get_options(Job)  # no run_after, no finished_at, ordered by its own create_time
    assert writes(job, Change.REQUEUE) == {}
    assert writes(job, Change.RETRY) == {}
    assert writes(job, Change.FAIL, error="boom") == {"last_error": "boom"}


def test_the_place_in_line_moves_only_where_the_claim_ordering_names_created_at():
    assert in_line_field(get_options(Document)) == "created_at"
    assert in_line_field(get_options(ColumnTask)) == "created_at"  # its column: "enqueued"
    # Ordered by its own "due": created_at is not a place in line and stays the enqueue time.
    own = get_options(NullableOrderTask)
    assert in_line_field(own) is None
    assert "created_at" not in writes(own, Change.SNOOZE, delay=5)
    assert "created_at" not in writes(own, Change.RETRY)
    assert "created_at" not in writes(get_options(Job), Change.RETRY)  # none at all


def test_plan_is_kept_per_options_object():
    opts = get_options(Document)
    assert plan(opts, Change.COMPLETE) is plan(opts, Change.COMPLETE)


def test_in_memory_sets_the_holder_and_drops_database_values():
    opts = get_options(Document)
    doc = Document(title="t")
    doc.__dict__["finished_at"] = "stale"
    apply_in_memory(doc, plan(opts, Change.CLAIM), holder="w9")
    apply_in_memory(doc, plan(opts, Change.COMPLETE))
    assert doc.locked_by == "w9"
    assert "finished_at" not in doc.__dict__


def test_holder_text_names_the_holder():
    opts = get_options(Document)
    assert isinstance(holder_text(opts, "from ", ""), Concat)
    assert repr(holder_text(opts, "from ")) != repr(holder_text(opts, "from ", ""))


@pytest.mark.django_db
def test_vendor_statements_get_the_table_through_the_claim_columns():
    columns = claim_columns(ColumnTask, get_options(ColumnTask), connection)
    qn = connection.ops.quote_name
    assert columns.claim_writes == ((qn("holder"), "holder"), (qn("claimed"), "clock"))
    assert columns.complete_writes == ((qn("ended"), "clock"),)
    pg = for_vendor("postgresql")
    assert pg.written_sql(columns.claim_writes, "w1") == (
        [f"{qn('holder')} = %s", f"{qn('claimed')} = STATEMENT_TIMESTAMP()"],
        ["w1"],
    )
    assert pg.written_sql(columns.complete_writes) == (
        [f"{qn('ended')} = STATEMENT_TIMESTAMP()"],
        [],
    )
    with pytest.raises(ValueError, match="cannot write"):
        pg.written_sql(columns.claim_writes)  # a holder needs its parameter
