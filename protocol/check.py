"""Check the Spin models of the protocol (protocol/taskclaim.pml, and the fan-in of the
workflows in protocol/fanin.pml), and tie them to the code.

    python protocol/check.py            run every check; exit 1 if a property fails or a
                                        broken design is accepted; exit 2 without spin/gcc
    python protocol/check.py --table    print docs/protocol.md's table of actions
    python protocol/check.py --names    list the names of protocol/actions.json that no
                                        longer exist in the code (with DJANGO_SETTINGS_MODULE
                                        set, e.g. tests.support.settings), and the tests it
                                        names that no longer exist in the suite

Each run is ``spin -a`` with the run's bounds, ``gcc`` (``-DSAFETY`` for the safety runs,
``-DNFAIR`` for the run under weak fairness) and ``pan`` exhaustively (no bit-state
hashing). The broken designs must each be rejected with a counterexample trail, which is
replayed with ``spin -t``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = HERE / "taskclaim.pml"
#: The fan-in of the workflows (docs/workflows.md): members' settles and one callback.
FAN_IN_MODEL = HERE / "fanin.pml"
ACTIONS = HERE / "actions.json"

ONE_HOLDER = "ONE HOLDER"
FENCED = "FENCED"
NO_EARLY_RERUN = "NO EARLY RE-RUN"
EXACTLY_ONCE = "EXACTLY ONCE"
RENEWALS = "RENEWALS NEVER WAIT"
NO_LOSS = "NO LOSS"
SAFETY = (ONE_HOLDER, FENCED, NO_EARLY_RERUN, EXACTLY_ONCE, RENEWALS)
CALLBACK_ONCE = "CALLBACK ONCE"
NEVER_EARLY = "NEVER EARLY"
NEVER_STUCK = "NEVER STUCK"
FAN_IN = (CALLBACK_ONCE, NEVER_EARLY, NEVER_STUCK)


@dataclass(frozen=True)
class Run:
    """One model check: the bounds (``-D`` defines) and what must come out."""

    name: str
    defines: dict[str, int | bool]
    checks: tuple[str, ...]
    #: None: every property in ``checks`` must hold; else the property that must fail
    expect_violation: str | None = None
    about: str = ""
    #: the Promela file checked
    model: Path = MODEL

    @property
    def liveness(self) -> bool:
        return NO_LOSS in self.checks

    def flags(self) -> list[str]:
        return [f"-D{k}" if v is True else f"-D{k}={v}" for k, v in self.defines.items()]


RUNS: tuple[Run, ...] = (
    Run(
        "safety",
        {"W": 3, "R": 1, "TOKMAX": 5},
        SAFETY,
        about="3 workers, 1 row, the compare-and-set claim with its read-back",
    ),
    Run(
        "safety-batch",
        {"W": 1, "R": 2, "TOKMAX": 3},
        SAFETY,
        about="2 rows held by one worker: batched completion, renewals skipping a locked row",
    ),
    Run(
        "safety-one-statement-claim",
        {"W": 3, "R": 1, "TOKMAX": 4, "CLAIM_ONE_STATEMENT": True},
        SAFETY,
        about="3 workers, the one-statement claim (PostgreSQL, skip-locked)",
    ),
    Run(
        "no-loss",
        {"W": 2, "R": 1, "TOKMAX": 4, "NOLOSS": True},
        (NO_LOSS,),
        about="2 workers, 1 row, weak fairness: no row stays processing for ever",
    ),
    Run(
        "broken-silence-as-death",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_SILENCE": True},
        SAFETY,
        NO_EARLY_RERUN,
        "a reaper that takes the rows of a worker whose registry fell silent",
    ),
    Run(
        "broken-unfenced-completion",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_UNFENCED": True},
        SAFETY,
        FENCED,
        "outcome writes WHERE id = ... only",
    ),
    Run(
        "broken-readback-by-pk",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_READBACK_PK": True},
        SAFETY,
        ONE_HOLDER,
        "a compare-and-set claim that reads its row back by primary key only",
    ),
    Run(
        "broken-heartbeat-waits-behind-acks",
        {"W": 1, "R": 2, "TOKMAX": 3, "WITNESS_HB_ACKS": True},
        SAFETY,
        RENEWALS,
        "a heartbeat that writes the buffered completions itself, waiting on row locks",
    ),
    Run(
        "broken-reaper-without-recheck",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_REAP_NORECHECK": True},
        SAFETY,
        EXACTLY_ONCE,
        "a reaper that selects expired rows, then updates them by id (River #1302)",
    ),
    Run(
        "broken-paused-holder-released",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_SUP_PAUSED": True},
        SAFETY,
        NO_EARLY_RERUN,
        "recovery that releases the rows of a child that stopped answering (paused)",
    ),
    Run(
        "broken-unfenced-plain-completion",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_UNFENCED_COMPLETE": True},
        SAFETY,
        FENCED,
        "the plain completion / retry / fail written WHERE id = ... only",
    ),
    Run(
        "broken-unfenced-batched-completion",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_UNFENCED_BATCH": True},
        SAFETY,
        FENCED,
        "the batched completion written WHERE id = ... only",
    ),
    Run(
        "broken-reaper-one-tick-early",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_REAP_EARLY": True},
        SAFETY,
        NO_EARLY_RERUN,
        "a reaper that takes a row one tick before its lease ends",
    ),
    Run(
        "broken-reaper-ignores-the-lease",
        {"W": 3, "R": 1, "TOKMAX": 5, "WITNESS_REAP_ANYTIME": True},
        SAFETY,
        NO_EARLY_RERUN,
        "a reaper that takes processing rows whatever their lease",
    ),
    Run(
        "fan-in",
        {"M": 4, "REQUEUE": True},
        FAN_IN,
        about="4 members, rolled-back settles, a member requeued and settled again",
        model=FAN_IN_MODEL,
    ),
    Run(
        "broken-fan-in-counted-outside-the-settle",
        {"M": 2, "WITNESS_OUTSIDE": True},
        FAN_IN,
        CALLBACK_ONCE,
        "the counter decremented and read after the member's settle committed",
        model=FAN_IN_MODEL,
    ),
    Run(
        "broken-fan-in-unguarded-resettle",
        {"M": 2, "REQUEUE": True, "WITNESS_UNGUARDED": True},
        FAN_IN,
        NEVER_EARLY,
        "a settle that decrements whether or not its edge is still open",
        model=FAN_IN_MODEL,
    ),
)


@dataclass
class Result:
    run: Run
    ok: bool = False
    states: int = 0
    seconds: float = 0.0
    violated: str | None = None
    detail: str = ""
    trail: list[str] = field(default_factory=list)


def violated_property(output: str) -> str | None:
    """The property a pan report says failed (None if none did)."""
    if re.search(r"^pan:\d+: acceptance cycle", output, re.M):
        return NO_LOSS
    if re.search(r"^pan:\d+: invalid end state", output, re.M):
        return "DEADLOCK"
    match = re.search(r"^pan:\d+: assertion violated (.*?) \(at depth", output, re.M)
    if not match:
        return None
    text = match.group(1)
    if text.strip() == "0":  # the only assert(false): the ONE HOLDER monitor
        return ONE_HOLDER
    if "ghost[" in text:
        return NO_EARLY_RERUN
    if "effect[" in text:
        return EXACTLY_ONCE
    if "alive[" in text:
        return RENEWALS
    if "mt[" in text:
        return FENCED
    if "released<=1" in text.replace(" ", ""):
        return CALLBACK_ONCE
    if "nsettled==" in text.replace(" ", ""):
        return NEVER_EARLY
    if "released==1" in text.replace(" ", ""):
        return NEVER_STUCK
    return f"assertion {text}"


def _run(cmd: list[str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    return done.stdout + done.stderr


def check(run: Run, *, timeout: float = 300.0) -> Result:
    """Run one model check in a fresh directory; return what came out."""
    result = Result(run)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="taskclaim-spin-") as tmp:
        work = Path(tmp)
        model = run.model
        shutil.copy(model, work / model.name)
        out = _run(["spin", *run.flags(), "-a", model.name], work, timeout)
        if not (work / "pan.c").exists():
            result.detail = f"spin -a failed: {out.strip()[-500:]}"
            return result
        # A broken design is rejected within a few thousand states: compile it fast.
        opt = "-O0" if run.expect_violation else "-O1"
        cc = ["gcc", opt, "-w", "-DMEMLIM=2048", "-o", "pan", "pan.c"]
        cc.insert(1, "-DNFAIR=5" if run.liveness else "-DSAFETY")
        out = _run(cc, work, timeout)
        if not (work / "pan").exists():
            result.detail = f"gcc failed: {out.strip()[-500:]}"
            return result
        pan = ["./pan", "-m500000"] + (["-a", "-f"] if run.liveness else [])
        out = _run(pan, work, timeout)
        result.seconds = time.monotonic() - started
        stored = re.search(r"(\d+) states, stored", out)
        result.states = int(stored.group(1)) if stored else 0
        if "max search depth too small" in out or "out of memory" in out or not stored:
            result.detail = f"incomplete search: {out.strip()[-500:]}"
            return result
        result.violated = violated_property(out)
        trail = work / f"{model.name}.trail"
        if trail.exists():
            replay = _run(["spin", *run.flags(), "-t", "-p", "-g", model.name], work, timeout)
            result.trail = [line for line in replay.splitlines() if line.strip()]
        if run.expect_violation is None:
            result.ok = result.violated is None
            result.detail = "" if result.ok else f"violated: {result.violated}"
        else:
            result.ok = result.violated == run.expect_violation and bool(result.trail)
            result.detail = (
                f"rejected ({result.violated}), trail of {len(result.trail)} lines"
                if result.ok
                else f"expected {run.expect_violation} to fail, got {result.violated or 'no error'}"
            )
    return result


def missing_tools() -> str | None:
    """Why the model cannot be checked here (None: spin and a C compiler are there)."""
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not installed (Debian: apt-get install spin gcc); "
            "the protocol model is not checked"
        )
    return None


def check_all(runs: tuple[Run, ...] = RUNS, *, jobs: int = 2) -> list[Result]:
    """Every run, ``jobs`` at a time, in the order given."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(check, runs))


# -- the table of actions -----------------------------------------------------------


def load_actions(path: Path = ACTIONS) -> list[dict[str, str]]:
    actions: list[dict[str, str]] = json.loads(path.read_text())["actions"]
    return actions


def model_labels(model: Path = MODEL) -> set[str]:
    """The action labels the model's comments carry."""
    return set(re.findall(r"\bA_[a-z_]+", model.read_text()))


def resolve(dotted: str) -> Any:
    """``package.module:Qual.name`` → the object."""
    module_name, _, qualname = dotted.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def missing_names(actions: list[dict[str, str]]) -> list[str]:
    """What the table names that the code no longer has: a function, a backend
    statement method, or the ORM call in the function's source. Needs Django set up."""
    problems = []
    for entry in actions:
        label = entry["label"]
        if "outside" in entry:
            continue
        function = entry.get("function", "")
        try:
            obj = resolve(function)
        except (ImportError, AttributeError, ValueError) as exc:
            problems.append(f"{label}: function {function} not found ({exc})")
            continue
        statement = entry.get("statement")
        if statement:
            module, _, attr = statement.partition(".")
            try:
                resolve(f"django_taskclaim.backends.{module}:{attr}")
            except (ImportError, AttributeError) as exc:
                problems.append(f"{label}: statement backends/{module}.py {attr} not found ({exc})")
        orm = entry.get("orm")
        if orm:
            source = inspect.getsource(obj)
            if orm not in source:
                problems.append(f"{label}: {function} no longer contains {orm!r}")
    return problems


def _test_names(path: Path) -> set[str]:
    """``name`` and ``Class::name`` of every test function a test file defines."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}::{item.name}")
    return {name for name in names if name.rpartition("::")[2].startswith("test")}


def missing_tests(actions: list[dict[str, Any]], root: Path = ROOT) -> list[str]:
    """Entries that name no test of their effect, and named tests (pytest node ids,
    ``path::function`` or ``path::Class::method``, a parameter id allowed) that the suite
    does not define. Reads the test files; imports nothing."""
    problems = []
    for entry in actions:
        label = entry["label"]
        tests = entry.get("tests")
        if not tests or not isinstance(tests, list):
            problems.append(f"{label}: names no test of its effect")
            continue
        for node_id in tests:
            path, _, name = str(node_id).partition("::")
            name = name.partition("[")[0]
            file = root / path
            if not path.startswith("tests/") or not path.endswith(".py") or not file.is_file():
                problems.append(f"{label}: test file {path} not found")
            elif name not in _test_names(file):
                problems.append(f"{label}: test {node_id} not found in {path}")
    return problems


def render_table(actions: list[dict[str, str]]) -> str:
    """The Markdown table of docs/protocol.md."""
    lines = [
        "| model action | what one step does | function | statement | tests of its effect |",
        "|---|---|---|---|---|",
    ]

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    for entry in actions:
        if "outside" in entry:
            where, what = f"({entry['outside']})", ""
        else:
            where = f"`{entry['function']}`"
            parts = []
            if entry.get("statement"):
                parts.append(f"`backends/{entry['statement']}`")
            if entry.get("orm"):
                parts.append(f"`{entry['orm']}`")
            what = "; ".join(parts)
        tests = "<br>".join(f"`{node_id}`" for node_id in entry.get("tests", []))
        lines.append(
            f"| `{entry['label']}` | {cell(entry['step'])} | {where} | {cell(what)} | {tests} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if "--table" in argv:
        sys.stdout.write(render_table(load_actions()))
        return 0
    if "--names" in argv:
        import django

        django.setup()
        problems = missing_names(load_actions()) + missing_tests(load_actions())
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    why = missing_tools()
    if why:
        print(f"protocol check skipped: {why}")
        return 2
    started = time.monotonic()
    failed = 0
    for result in check_all():
        verdict = "ok" if result.ok else "FAILED"
        failed += not result.ok
        detail = result.detail or "every property holds"
        print(
            f"{verdict:6} {result.run.name:38} {result.states:>9} states "
            f"{result.seconds:6.1f} s  {detail}"
        )
    print(
        f"protocol check: {len(RUNS) - failed}/{len(RUNS)} ok in {time.monotonic() - started:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
