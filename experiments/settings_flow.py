"""Where the whole settings tree travels: from a function that holds `RunSettings`, every call
that passes it on (as an argument, positional or keyword, or `evolve(cfg, ...)` of it), followed
transitively through the modules it enters.

    python -m experiments.settings_flow [orchestrator.commands.investigate:plan] [--calls]

Prints the modules entered, and the calls that go up a layer (the callee's package is above the
caller's in the layers contract, pyproject.toml `[tool.importlinter]`): a module that hands the
settings back up to a higher layer. Static and approximate on purpose (what a reader following
the code by hand would count): a call is resolved through the module's imports, its own
functions and classes, and `self.` methods; a call it cannot resolve (a method of an object
held elsewhere, a callback) is not followed. docs/design.md reports its figures.
"""

from __future__ import annotations

import argparse
import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in (ROOT / "orchestrator").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text())
    return out


LAYERS_FROM: Path | None = None


def _layers() -> list[str]:
    doc = tomllib.loads((LAYERS_FROM or ROOT / "pyproject.toml").read_text())
    return doc["tool"]["importlinter"]["contracts"][0]["layers"]


def _layer_of(module: str, layers: list[str]) -> int:
    for i, layer in enumerate(layers):
        if module == layer or module.startswith(layer + "."):
            return i
    return len(layers)


class Index:
    """Each module's functions (`f`, `Class.f`), classes and import aliases."""

    def __init__(self, modules: dict[str, ast.Module]):
        self.modules = modules
        self.functions: dict[tuple[str, str], ast.FunctionDef] = {}
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.aliases: dict[str, dict[str, str]] = {}
        for name, tree in modules.items():
            alias: dict[str, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for a in node.names:
                        alias[a.asname or a.name] = f"{node.module}.{a.name}"
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        alias[a.asname or a.name.split(".")[0]] = a.name
            self.aliases[name] = alias
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    self.functions[(name, node.name)] = node
                elif isinstance(node, ast.ClassDef):
                    self.classes[(name, node.name)] = node
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef):
                            self.functions[(name, f"{node.name}.{item.name}")] = item

    def _target(self, dotted: str) -> tuple[str, str] | None:
        """`pkg.mod.func` or `pkg.mod.Class` -> (module, function)."""
        if dotted in self.modules:
            return None
        module, _, attr = dotted.rpartition(".")
        if (module, attr) in self.functions:
            return module, attr
        if module in self.aliases and attr in self.aliases[module]:  # a name it re-exports
            return self._target(self.aliases[module][attr])
        if (module, attr) in self.classes:
            return (module, f"{attr}.__init__") if (module, f"{attr}.__init__") in \
                self.functions else None
        return None

    def resolve(self, module: str, cls: str | None, call: ast.Call) -> tuple[str, str] | None:
        f = call.func
        alias = self.aliases[module]
        if isinstance(f, ast.Name):
            if (module, f.id) in self.functions:
                return module, f.id
            if (module, f.id) in self.classes:
                return self._target(f"{module}.{f.id}")
            return self._target(alias[f.id]) if f.id in alias else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            base = f.value.id
            if base == "self" and cls and (module, f"{cls}.{f.attr}") in self.functions:
                return module, f"{cls}.{f.attr}"
            if base in alias:
                return self._target(f"{alias[base]}.{f.attr}")
            if (module, f"{base}.{f.attr}") in self.functions:  # Class.method(...)
                return module, f"{base}.{f.attr}"
        return None


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _passes(call: ast.Call, held: set[str]) -> list[tuple[int | str, str]]:
    """Where a call passes a held name: (position or keyword, name)."""
    out: list[tuple[int | str, str]] = []

    def holds(node: ast.AST) -> bool:
        if isinstance(node, ast.Name) and node.id in held:
            return True
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                f"{node.value.id}.{node.attr}" in held:  # self.cfg of an object holding it
            return True
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "evolve" and node.args and holds(node.args[0]))

    for i, arg in enumerate(call.args):
        if holds(arg):
            out.append((i, ""))
    for kw in call.keywords:
        if kw.arg and holds(kw.value):
            out.append((kw.arg, ""))
    return out


def follow(index: Index, start: tuple[str, str], name: str = "cfg"):
    """The functions the settings reach from `start` (held there as `name`), and the calls
    among them that go up a layer."""
    layers = _layers()
    seen: set[tuple[str, str]] = set()
    up: set[tuple[str, str]] = set()
    kept: dict[tuple[str, str], set[str]] = {}  # (module, class) -> self.X holding it
    done: set[tuple[str, str, str]] = set()
    todo = [(start, name)]
    while todo:
        (module, fn_name), held_name = todo.pop()
        if (module, fn_name, held_name) in done:
            continue
        done.add((module, fn_name, held_name))
        seen.add((module, fn_name))
        fn = index.functions[(module, fn_name)]
        cls = fn_name.split(".")[0] if "." in fn_name else ""
        held = {held_name} | kept.get((module, cls), set())
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    pairs = (zip(t.elts, node.value.elts, strict=False) if isinstance(t, ast.Tuple)
                             and isinstance(node.value, ast.Tuple) else [(t, node.value)])
                    for n, value in pairs:
                        if not _passes(ast.Call(func=ast.Name("x"), args=[value], keywords=[]),
                                       held):
                            continue
                        if isinstance(n, ast.Name):
                            held.add(n.id)
                        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                                and n.value.id == "self" and cls:
                            # the object keeps it: each of its methods holds it
                            kept.setdefault((module, cls), set()).add(f"self.{n.attr}")
                            todo.extend(((m, f), f"self.{n.attr}") for (m, f) in index.functions
                                        if m == module and f.startswith(cls + "."))
            if not isinstance(node, ast.Call):
                continue
            where = _passes(node, held)
            callee = index.resolve(module, cls or None, node) if where else None
            if callee is None or callee not in index.functions:
                continue
            params = _params(index.functions[callee])
            if params and params[0] == "self":
                params = params[1:]
            for pos, _ in where:
                target = (params[pos] if isinstance(pos, int) and pos < len(params)
                          else pos if isinstance(pos, str) and pos in params else None)
                if target is None:
                    continue
                if _layer_of(callee[0], layers) < _layer_of(module, layers):
                    up.add((f"{module}:{fn_name}", f"{callee[0]}:{callee[1]}"))
                todo.append((callee, target))
    return seen, sorted(up)


def main() -> None:
    global ROOT, LAYERS_FROM
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("start", nargs="?", default="orchestrator.commands.investigate:plan")
    parser.add_argument("--calls", action="store_true", help="list the functions entered")
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout to read (its pyproject.toml names the layers)")
    parser.add_argument("--layers-from", type=Path, default=None,
                        help="another pyproject.toml to take the layers from")
    args = parser.parse_args()
    if args.root is not None:
        ROOT = args.root.resolve()
    LAYERS_FROM = args.layers_from
    module, _, fn = args.start.partition(":")
    index = Index(_modules())
    first = index.functions[(module, fn)]
    seen, up = follow(index, (module, fn), _params(first)[0])
    modules = sorted({m for m, _ in seen})
    print(f"{len(modules)} modules entered, {len(seen)} functions; {len(up)} calls up a layer")
    for m in modules:
        print(f"  {m}")
    for caller, callee in up:
        print(f"  up: {caller} -> {callee}")
    if args.calls:
        for m, f in sorted(seen):
            print(f"  call: {m}:{f}")


if __name__ == "__main__":
    main()
