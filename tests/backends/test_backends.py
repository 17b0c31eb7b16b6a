"""Vendor SQL lives in ``django_taskclaim/backends`` only: the rest of the package asks it.

Static checks over the source (no database), plus the statements the claim path gets
from the backends.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from django_taskclaim.backends import ClaimColumns, Statement, for_vendor

PACKAGE = Path(__file__).resolve().parents[2] / "django_taskclaim"
#: Not the runtime: the schema history, the race lab (it demonstrates broken recipes in
#: its own SQL on purpose) and the embedded-server launcher used by the demo and tests.
OUTSIDE = ("backends/", "migrations/", "contrib/racelab/", "embedded.py")
STATEMENT = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|SET|WITH|LISTEN|NOTIFY|CREATE)\s")
BACKEND_CALLS = {"for_connection", "for_alias", "for_vendor", "for_engine"}


def runtime_modules() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(str(p.relative_to(PACKAGE)).startswith(o) for o in OUTSIDE)
    ]


def _asks_the_backend(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in BACKEND_CALLS
    return isinstance(node, ast.Name) and node.id in {"sql", "backend"}


@pytest.mark.parametrize("path", runtime_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_vendor_read_and_no_statement_outside_the_backends(path):
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        if isinstance(node, ast.Attribute) and node.attr in ("vendor", "mysql_is_mariadb"):
            assert _asks_the_backend(node.value), f"{path.name}: {ast.unparse(node)}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert not STATEMENT.match(node.value), (path.name, node.value[:80])
        if isinstance(node, ast.Constant) and node.value == "ENGINE":
            pytest.fail(f"{path.name} reads a database ENGINE (ask backends.for_engine)")


#: Literal text of an f-string that builds SQL: a statement's or a condition's keywords,
#: or a placeholder. Such text is built by a vendor method, never formatted elsewhere.
SQL_IN_FSTRING = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|FROM|CASE|WHEN|THEN|VALUES|JOIN)\b|\bIN \(|%s"
    r"|\bIS (NOT )?NULL\b"
)


def sql_fstrings(source: str) -> list[str]:
    """The f-strings of ``source`` whose literal parts look like SQL."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
            if SQL_IN_FSTRING.search(text):
                found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", runtime_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_sql_built_with_f_strings_outside_the_backends(path):
    assert not sql_fstrings(path.read_text()), f"{path.name}: ask a vendor method (backends/)"


def test_the_f_string_rule_finds_sql_it_should():
    # What batch.py once built itself, before the backends did (tokens_match, value_per_row).
    assert sql_fstrings('RawSQL(f"({pk}, {version}) IN ({pairs})", params)')
    assert sql_fstrings('x = f"CASE {pk} {branches} ELSE {column} END"')
    assert sql_fstrings('q = f"SELECT 1 FROM {table}"')
    assert sql_fstrings('return f"{quoted} IS NOT NULL"')
    assert not sql_fstrings('logger.info(f"claimed {n} rows from {label}")')


def test_the_backends_import_nothing_of_the_package_above_them():
    for path in sorted((PACKAGE / "backends").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.startswith("django_taskclaim"):
                    assert name.startswith("django_taskclaim.backends"), (path.name, name)


def test_batched_writes_take_values_as_parameters():
    sql = for_vendor("postgresql")
    st = sql.tokens_match('"t"."id"', '"t"."v"', [(1, 3), (2, 5)])
    assert st == Statement('("t"."id", "t"."v") IN ((%s, %s), (%s, %s))', (1, 3, 2, 5))
    st = sql.value_per_row('"t"."id"', '"t"."r"', [(1, "a"), (2, "b")])
    assert st.sql == 'CASE "t"."id" WHEN %s THEN %s WHEN %s THEN %s ELSE "t"."r" END'
    assert st.params == (1, "a", 2, "b")


COLUMNS = ClaimColumns(
    table='"t"',
    pk='"id"',
    status='"state"',
    version='"v"',
    attempts='"a"',
    locked_until='"lu"',
    returning='"t"."id", "t"."state"',
    claim_writes=(('"lb"', "holder"),),
)


def test_the_postgresql_claim_is_one_parameterised_statement():
    pg = for_vendor("postgresql")
    st = pg.claim(
        COLUMNS,
        Statement('SELECT "id", "lu" FROM "t" WHERE "state" = %s LIMIT 5', ("ready",)),
        processing="processing",
        ready="ready",
        lease=30.0,
        worker="w1",
    )
    assert st.sql.startswith('WITH "taskclaim_c"("pk", "prev") AS MATERIALIZED (SELECT')
    assert st.sql.count("%s") == len(st.params) == 5
    assert st.params == ("ready", "processing", 30.0, "w1", "ready")
    assert '"lb" = %s' in st.sql  # the holder is recorded when the model has the field
    assert "w1" not in st.sql  # values only as parameters


def test_vendor_capabilities_agree_with_what_each_vendor_implements():
    pg, my, lite = (for_vendor(v) for v in ("postgresql", "mysql", "sqlite"))
    assert pg.claim_strategies >= {"cas", "skip_locked", "advisory", "serializable", "hold"}
    assert my.claim_strategies == {"cas", "skip_locked"}
    assert lite.claim_strategies == {"cas"}
    for sql in (my, lite):
        assert not sql.claims_in_one_statement
        with pytest.raises(NotImplementedError):
            sql.claim(COLUMNS, Statement("SELECT 1"), processing=1, ready=0, lease=1, worker="w")
        assert not sql.completes_from_arrays
        assert not sql.supports_notify
    assert pg.supports_notify
    assert pg.notify("chan", "app.Model") == Statement(
        "SELECT pg_notify(%s, %s)", ("chan", "app.Model")
    )
    assert my.now_sql(use_tz=True) == "UTC_TIMESTAMP(6)"  # never the session's zone
    assert lite.private_to_one_connection({"NAME": ":memory:"})
    assert not lite.private_to_one_connection({"NAME": "/tmp/x.sqlite3"})
    assert lite.one_writer_at_a_time
    assert not pg.one_writer_at_a_time
