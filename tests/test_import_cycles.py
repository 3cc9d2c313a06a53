"""No import circles in the package, no loose modules at its root, no long module unexplained.

Walks every module's imports with `ast` (nothing is imported): module-level imports, imports
inside functions (a lazy import that closes a circle is still a circle: each half needs the
other to work) and imports under `if TYPE_CHECKING:` (a type hint on the other half's live
object is the same coupling). `python -m tests.test_import_cycles` prints the graph's cycles.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "orchestrator"
# The root holds the CLI entry points and a few core records every layer shares.
ROOT_MODULES = {"__init__", "__main__", "cli", "errors", "metrics", "records"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The package modules `path` imports (`from a import b` counts `a.b` when it is a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name in known:
                found.add(name)
    if path.is_relative_to(ROOT):
        found.discard(module_name(path))
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    g = {}
    for name, path in mods.items():
        deps = imports_of(path, known)
        # A package's own __init__ re-exporting its modules is not a dependency of those
        # modules on each other; importing `a.b` runs `a/__init__` first, but the edge that
        # matters is the one to the module named.
        g[name] = {d for d in deps if not name.startswith(d + ".") and d != name}
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_sees_a_cycle(tmp_path):
    """The checker itself: a two-module circle through a lazy import is found."""
    g = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}
    assert cycles(g) == [["p.a", "p.b"]]
    (tmp_path / "m.py").write_text("def f():\n    from p.b import x\n")
    assert imports_of(tmp_path / "m.py", {"p.a", "p.b"}) == {"p.b"}


def test_root_holds_only_the_cli_and_core_records():
    loose = sorted(p.stem for p in (ROOT / PACKAGE).glob("*.py") if p.stem not in ROOT_MODULES)
    assert not loose, f"modules at {PACKAGE}/ root: {loose}"


if __name__ == "__main__":
    for c in cycles(graph()):
        print(" <-> ".join(c))


def test_long_modules_say_why():
    """A module past ~400 lines states at its top why it stays one module ("Size: ...")."""
    long = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > 430:
            doc = ast.get_docstring(ast.parse("\n".join(lines))) or ""
            if "Size:" not in doc:
                long.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert not long, f"long modules without a stated reason: {long}"


def test_strategies_hold_the_contract_and_one_package_per_strategy():
    """`strategies/` holds the contract (`base.py`) beside one package per strategy: a module
    at its top level would be a piece no strategy owns, or one only a single strategy uses."""
    top = ROOT / PACKAGE / "strategies"
    loose = sorted(p.name for p in top.glob("*.py") if p.stem not in {"__init__", "base"})
    assert not loose, f"modules at strategies/ top level: {loose}"
    packages = {p.name for p in top.iterdir() if (p / "__init__.py").is_file()}
    assert {"bisect", "isolate", "sweep"} <= packages, packages


def test_the_simulated_server_imports_none_of_the_scenarios_it_plays():
    """`targets/sim/` is the server a trial launches; the scenario generator and the oracles
    (`sim_scenarios/`) build on its model, never the other way round."""
    server = f"{PACKAGE}.targets.sim"
    found = sorted(f"{m} -> {d}" for m, deps in graph().items()
                   if m == server or m.startswith(server + ".")
                   for d in deps if d.startswith(f"{PACKAGE}.sim_scenarios"))
    assert not found, found
