"""docs/tutorial.md runs as written: its ``bash`` and ``python`` blocks, in order, on a
fresh copy of the example project and a SQLite file of its own.

What the page marks (an HTML comment on the line before a block, invisible on GitHub):

- ``<!-- tutorial: no-run (why) -->``: not run (an interactive prompt, a server);
- ``<!-- tutorial: output -->`` on a ``text`` block: exactly what the block before it
  printed (the lines, compared one by one);
- ``<!-- tutorial: excerpt of PATH -->`` on a ``python`` block: its lines appear in that
  file of the repository, in that order (the page shows the real model).

``bash`` blocks run in one shell session, in effect: the directory and the exported
variables carry over from block to block. ``python`` blocks run in ``python manage.py
shell`` where the shell blocks left off. Real commands, real database, no mocks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("TASKCLAIM_TEST_DB", "postgres") != "sqlite",
    reason="runs the example project on a SQLite file of its own: once, in the SQLite pass",
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(
    r"(?:<!-- tutorial: (?P<mark>[^\n]*?) -->\n)?^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$",
    re.S | re.M,
)
MARKS = ("no-run", "output", "excerpt of ")
#: The page promises "under ten minutes"; most of that is reading. What runs must be quick.
RUN_BUDGET = 120.0


@dataclass
class Block:
    lang: str
    body: str
    mark: str
    line: int


def blocks() -> list[Block]:
    text = PAGE.read_text()
    found = []
    for m in BLOCK.finditer(text):
        mark = m["mark"] or ""
        assert not mark or mark.startswith(MARKS), f"unknown tutorial mark {mark!r}"
        found.append(Block(m["lang"], m["body"], mark, text.count("\n", 0, m.start("body"))))
    return found


def test_the_page_has_what_the_test_runs():
    runs = [b for b in blocks() if b.lang in ("bash", "python") and not b.mark]
    assert len(runs) >= 10, "the tutorial's blocks are not found: check the fences"
    outputs = [b for b in blocks() if b.mark == "output"]
    assert outputs, "no output is checked"
    assert all(b.lang == "text" for b in outputs)
    for block in blocks():
        assert block.lang in ("bash", "python", "text"), f"line {block.line}: {block.lang!r}"


def excerpt_is_in(block: Block) -> None:
    path = ROOT / block.mark.removeprefix("excerpt of ").strip()
    lines = [line.strip() for line in path.read_text().splitlines()]
    at = 0
    for wanted in (line.strip() for line in block.body.splitlines()):
        if not wanted:
            continue
        try:
            at = lines.index(wanted, at) + 1
        except ValueError:
            pytest.fail(f"docs/tutorial.md line {block.line}: {wanted!r} is not in {path}")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A throwaway copy of the example project (no var/, no .env) beside nothing else."""
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT / "example_project",
        repo / "example_project",
        ignore=shutil.ignore_patterns("var", ".env", "__pycache__"),
    )
    return repo


class Session:
    """A shell whose directory and exported variables carry over between blocks."""

    def __init__(self, start: Path, tmp: Path) -> None:
        self.cwd = start
        self.state = tmp / "exports.sh"
        self.state.write_text("")
        self.where = tmp / "cwd"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "DATABASE_URL",
                "DJANGO_SETTINGS_MODULE",
                "PYTHONPATH",
                "TASKCLAIM_TEST_DB_NAME",
                "EMBEDDED_PG_DIR",
            )
        }
        # `python` is this virtualenv's, as after `source .venv/bin/activate`.
        self.env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + self.env["PATH"]

    def run(self, script: str, what: str) -> str:
        wrapper = (
            f'set -euo pipefail\ncd "$1"\nsource "$2"\n{script}\npwd > "$3"\nexport -p > "$2"\n'
        )
        proc = subprocess.run(
            ["bash", "-c", wrapper, "bash", str(self.cwd), str(self.state), str(self.where)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, (
            f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
        self.cwd = Path(self.where.read_text().strip())
        return proc.stdout

    def python(self, code: str, what: str) -> str:
        quoted = code.replace("'", "'\\''")
        return self.run(f"python manage.py shell --no-imports -c '{quoted}'", what)


def test_the_tutorial_runs_as_written(checkout, tmp_path):
    session = Session(checkout, tmp_path)
    last_output: str | None = None
    started = time.monotonic()
    for block in blocks():
        what = f"docs/tutorial.md block at line {block.line}"
        if block.mark.startswith("excerpt of "):
            excerpt_is_in(block)
        elif block.mark == "output":
            assert last_output is not None, f"{what}: an output with no block before it"
            printed = [line.rstrip() for line in last_output.strip().splitlines()]
            assert printed == block.body.strip().splitlines(), what
        elif block.mark.startswith("no-run") or block.lang == "text":
            continue
        elif block.lang == "bash":
            last_output = session.run(block.body, what)
        elif block.lang == "python":
            last_output = session.python(block.body, what)
    assert time.monotonic() - started < RUN_BUDGET
    # Everything ran in the copy: its own database file, nothing written to the checkout.
    assert (checkout / "example_project" / "var" / "tutorial.sqlite3").exists()
