"""The stack of docs/architecture.md, enforced: no module imports one above it (at module
level or deferred inside a function), and no import cycle.

Every module is placed by its own name: the layer of the longest prefix in :data:`LAYERS`,
where only a package that stands on one layer whole (:data:`WHOLE`) places the modules under
it. Each module of a package that spans layers is named, so a new file there fails
:func:`test_every_module_has_a_layer` until it is placed.
Importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` too, so an import counts as
an edge to each package on the way. Imports under ``if TYPE_CHECKING:`` never run and
are left out. Pure logic: no database.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_taskclaim"

#: Bottom first. A module may import its own layer (if that closes no cycle) and below.
LAYERS: list[tuple[str, ...]] = [
    # 0: foundations that import nothing of ours above them
    (
        "django_taskclaim",  # the package's own __init__: eager import of exceptions only
        "django_taskclaim.exceptions",
        "django_taskclaim.signals",
        "django_taskclaim.capped",
        "django_taskclaim.telemetry",  # the worker's OpenTelemetry instruments (optional)
        "django_taskclaim.row",  # the row vocabulary: states, the shape of a claimed row
        "django_taskclaim.config",
        "django_taskclaim.config.settings",
        "django_taskclaim.config.bounds",
        "django_taskclaim.config.commandline",
        "django_taskclaim.model",  # its __init__ only
        "django_taskclaim.locks",  # its __init__ names the public lock API lazily
        "django_taskclaim.locks.keys",
        "django_taskclaim.deprecation",  # the moved import paths (imports nothing of ours)
        "django_taskclaim.redact",  # passwords out of printed URLs and error messages
    ),
    # 1: vendor SQL
    ("django_taskclaim.backends",),
    # 2: database plumbing
    ("django_taskclaim.db",),
    # 3: a model's options, as validated once
    (
        "django_taskclaim.config.claim_meta",
        "django_taskclaim.config.rate_limits",  # ClaimMeta.rate_limit / key_rate_limit
        "django_taskclaim.config.options",
        "django_taskclaim.config.discovery",
    ),
    # 4: the shared predicates and the model-building pieces that need the options
    (
        "django_taskclaim.rules",
        "django_taskclaim.model.concurrency_keys",
        "django_taskclaim.model.unique",
        "django_taskclaim.model.unique_insert",
        "django_taskclaim.model.indexes",
        "django_taskclaim.periodic",  # its __init__
        "django_taskclaim.periodic.registry",
        "django_taskclaim.periodic.timing",
        "django_taskclaim.periodic.cron",
        "django_taskclaim.periodic.call",
    ),
    # 5: claiming
    ("django_taskclaim.claim",),
    # 6: every fenced write after a claim, and the wake-ups a settle sends (a released
    # dependent wakes the workers as a new row does)
    ("django_taskclaim.settle", "django_taskclaim.wakeup"),
    # 7: recovery
    ("django_taskclaim.recovery",),
    # 8: the user's queryset API and the model mixins
    (
        "django_taskclaim.model.enqueue",  # enqueue_many: bulk_create + one notify
        "django_taskclaim.model.queryset",
        "django_taskclaim.model.mixins",
    ),
    # 9: the app's own models
    ("django_taskclaim.models",),
    # 10: features built on the models
    (
        "django_taskclaim.locks.advisory_lock",
        "django_taskclaim.locks.lease",
        "django_taskclaim.locks.lease_sql",
        "django_taskclaim.locks.renewer",
        "django_taskclaim.locks.singleton_lock",
        "django_taskclaim.locks.state",
        "django_taskclaim.periodic.slots",
        "django_taskclaim.periodic.reported",  # which models the overviews list
        "django_taskclaim.ops",
        "django_taskclaim.outbox",
        "django_taskclaim.flow",  # pause / resume (writes QueuePause); rate_view (reads RateSlot)
    ),
    # 11: the worker
    ("django_taskclaim.worker",),
    # 12: what Django calls: checks, admin, commands, contrib apps, template tags
    (
        "django_taskclaim.apps",
        "django_taskclaim.checks",
        "django_taskclaim.ops.doctor",  # reuses the checks' rules
        "django_taskclaim.admin",
        "django_taskclaim.management",
        "django_taskclaim.contrib",
        "django_taskclaim.templatetags",
        "django_taskclaim.embedded",
    ),
]
LEVEL = {prefix: i for i, group in enumerate(LAYERS) for prefix in group}

#: Packages that stand on one layer whole: a new module under one of them takes its layer.
WHOLE = frozenset(
    {
        "django_taskclaim.row",
        "django_taskclaim.backends",
        "django_taskclaim.claim",
        "django_taskclaim.settle",
        "django_taskclaim.recovery",
        "django_taskclaim.wakeup",
        "django_taskclaim.outbox",
        "django_taskclaim.flow",
        "django_taskclaim.ops",
        "django_taskclaim.ops.doctor",
        "django_taskclaim.worker",
        "django_taskclaim.checks",
        "django_taskclaim.admin",
        "django_taskclaim.management",
        "django_taskclaim.contrib",
        "django_taskclaim.templatetags",
    }
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts}


def layer(module: str) -> int:
    """The layer of ``module``: its own entry, else that of the nearest package above it
    that stands on one layer whole."""
    found = LEVEL.get(module)
    if found is not None:
        return found
    parts = module.split(".")
    for n in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:n])
        if package in WHOLE:
            return LEVEL[package]
    raise AssertionError(f"{module} is in no layer of LAYERS: add it by its own name")


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``module`` that runs, with the
    packages whose ``__init__`` the import runs on the way."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [base]
            targets += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
        for target in targets:
            if not target.startswith("django_taskclaim"):
                continue
            parts = target.split(".")
            for n in range(1, len(parts) + 1):
                name = ".".join(parts[:n])
                # A module's own packages have run their __init__ before it: no edge.
                if name in MODULES and name != module and not module.startswith(name + "."):
                    found.append((name, node.lineno))
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


def test_no_import_runs_up_the_stack():
    upward = [
        f"{module}:{line} imports {target} (layer {layer(module)} -> {layer(target)})"
        for module, edges in GRAPH.items()
        for target, line in edges
        if layer(target) > layer(module)
    ]
    assert upward == [], "imports up the stack of docs/architecture.md:\n" + "\n".join(upward)


def test_no_import_cycle():
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        edges[module].update(t for t, _ in targets)
    # Tarjan's strongly connected components: any component of two or more is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in list(MODULES):
        if v not in index:
            visit(v)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


WORKER_PROCESS = "django_taskclaim.worker.process"
TC_ONLY = (
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import django_taskclaim.models\n"
)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from django_taskclaim.worker import process\n",
            ["django_taskclaim.worker", "django_taskclaim.worker.process"],
        ),
        ("def f():\n    import django_taskclaim.models\n", ["django_taskclaim.models"]),
        (TC_ONLY, []),
    ],
)
def test_the_scan_sees_deferred_imports_and_skips_type_checking(
    tmp_path, monkeypatch, source, expected
):
    monkeypatch.setitem(MODULES, "django_taskclaim.rules", tmp_path / "rules.py")
    (tmp_path / "rules.py").write_text(source)
    got = [t for t, _ in imports_of("django_taskclaim.rules")]
    assert sorted(set(got)) == sorted(expected)


def test_a_new_module_is_placed_by_its_own_name_where_its_package_spans_layers():
    """``model/`` spans layers (its model-building pieces, the queryset on top): a new file
    there has no layer until it is named; under a package standing on one layer, it has
    that layer."""
    with pytest.raises(AssertionError, match="no layer"):
        layer("django_taskclaim.model.progress")
    assert layer("django_taskclaim.settle.progress") == LEVEL["django_taskclaim.settle"]
