"""The package's layers, read from its own import statements (DESIGN.md "Architecture").

Each module may import only modules of its own layer or of the layers below it, the import
graph has no cycles, and moejax modules are imported at module level (a function-local import
hides an edge from readers), except in the CLI, which defers a subcommand's imports until that
subcommand runs so `moejax --help` starts fast, and for the few modules in `HEAVY`. Local
imports still count as edges for the layer and cycle checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "moejax"

# Lowest first. A module belongs to the layer of its longest matching prefix.
LAYERS = [
    ("base", ["moejax", "moejax.errors", "moejax.relax", "moejax.ops", "moejax.output"]),
    ("data", ["moejax.catalog", "moejax.trace"]),
    ("physics", ["moejax.physics", "moejax.placement"]),
    ("systems", ["moejax.system", "moejax.systems", "moejax.tunable"]),
    ("runner", ["moejax.runner", "moejax.api"]),  # api: simulate by names, over the engine
    ("tune", ["moejax.tune"]),
    ("interfaces", ["moejax.reproduce", "moejax.latency_table", "moejax.validation"]),
    ("cli", ["moejax.cli"]),
]
LAZY_ALLOWED = ("moejax.cli",)
# Modules whose import is expensive enough that their users import them inside the function
# that needs them: the numba event core loads (and on a cold cache compiles) its kernels.
HEAVY = {"moejax.systems.amoe.core"}
MAX_LINES = 620  # "no file over ~600 lines": one concern per module


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


MODULES = _modules()


def _resolve(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(name: str, path: Path) -> list[tuple[str, bool, int]]:
    """(imported moejax module, inside a function?, line) for every import in a module."""
    out = []

    def visit(node, local):
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.If) and getattr(child.test, "id", "") == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.Import):
                out.extend((_resolve(a.name), inner, child.lineno) for a in child.names
                           if a.name.split(".")[0] == "moejax")
            elif (isinstance(child, ast.ImportFrom)
                  and (child.module or "").split(".")[0] == "moejax"):
                for a in child.names:
                    full = f"{child.module}.{a.name}"
                    out.append((full if full in MODULES else _resolve(child.module), inner,
                                child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def layer_of(module: str) -> int:
    best, level = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (module == pre or module.startswith(pre + ".")) and len(pre) > len(best):
                best, level = pre, i
    assert level is not None, f"{module} is in no layer: add it to LAYERS"
    return level


def test_every_import_points_to_the_same_or_a_lower_layer():
    upward = [f"{m}:{line} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m, edges in GRAPH.items() for t, _, line in edges
              if layer_of(t) > layer_of(m)]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_import_graph_has_no_cycles():
    # Tarjan's strongly connected components over module-level and local imports
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _, _ in GRAPH[v]:
            if w == v:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            connect(v)
    assert not cycles, f"import cycles: {cycles}"


def test_moejax_modules_are_imported_at_module_level():
    local = [f"{m}:{line} imports {t} inside a function"
             for m, edges in GRAPH.items() if not m.startswith(LAZY_ALLOWED)
             for t, inner, line in edges if inner and t not in HEAVY]
    assert not local, "\n".join(sorted(local))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_at_most_about_600_lines(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name]}: {lines} lines; split it by concern"
