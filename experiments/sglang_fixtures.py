"""Regenerate the SGLang fixtures under `tests/fixtures/sglang_<version>/` from a real package.

The tests never import SGLang (it needs torch and several GB); they read what this script saved
from an installed release, so the simulator and the adapter are checked against SGLang's own
source and parser rather than against our memory of them. Run it from sleuth's own venv:

    # once, in a venv of its own (not sleuth's; ~8 GB with torch):
    python3 -m venv ~/sglang-venv && ~/sglang-venv/bin/pip install sglang==0.5.23
    .venv/bin/python experiments/sglang_fixtures.py --python ~/sglang-venv/bin/python

    # facts read from the source only (no install, no parser runs), e.g. an older wheel:
    pip download --no-deps sglang==0.5.9 -d wheels && unzip -q wheels/sglang-0.5.9-*.whl -d src
    .venv/bin/python experiments/sglang_fixtures.py --source src/sglang --version 0.5.9

Saved (checked in; last regenerated from 0.5.23 with `--python` and 0.5.9 with `--source`):
- `source_facts.json` (both modes): metric names and kinds, the forward-time categories each
  runner files passes under, the scheduler's decode/prefill log f-strings, the graph-field
  labels, `meta_info` keys, HTTP routes, `/model_info` fields, bench_serving's flags and result
  keys, ServerArgs field names, and where the accept-length totals, the verify-call counter and
  the decode-pass counter are updated (each with the file and function it was read from).
- with `--python` only: `launch_server_help.txt` (the installed `--help`), `argv_checks.json`
  (sleuth's own launch argv for the shipped configs, and the removed `--cuda-graph-max-bs`, put
  through `ServerArgs.add_cli_args` / `prepare_server_args`), `server_info_keys.json` (the keys
  `build_server_info` returns for sleuth's argv).

Paths of the machine that ran it (the venv, the home directory) are replaced by `<...>`
placeholders before anything is written.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DECODE_LOG_FUNCS = ("report_decode_stats", "log_decode_stats")
PREFILL_LOG_FUNCS = ("report_prefill_stats", "log_prefill_stats")


# -- reading the source -----------------------------------------------------------------------
class Source:
    def __init__(self, pkg: Path):
        self.pkg = pkg  # the `sglang` package directory
        self._trees: dict[Path, ast.Module] = {}

    def files(self, under: str = "srt") -> list[Path]:
        return sorted((self.pkg / under).rglob("*.py"))

    def tree(self, path: Path) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(path.read_text(errors="replace"))
        return self._trees[path]

    def rel(self, path: Path) -> str:
        return "sglang/" + path.relative_to(self.pkg).as_posix()

    def containing(self, needle: str, under: str = "srt") -> list[Path]:
        return [p for p in self.files(under) if needle in p.read_text(errors="replace")]

    def functions(self, path: Path, names: tuple[str, ...]) -> list[ast.FunctionDef]:
        return [n for n in ast.walk(self.tree(path))
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name in names]


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _in_order(nodes):
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _fstrings(fn: ast.AST) -> list[str]:
    """The f-strings in `fn` in source order (not the `:.2f` format specs inside them)."""
    specs = {id(n.format_spec) for n in ast.walk(fn) if isinstance(n, ast.FormattedValue) and n.format_spec}
    return [ast.unparse(n) for n in _in_order(
        n for n in ast.walk(fn) if isinstance(n, ast.JoinedStr) and id(n) not in specs)]


def metrics(src: Source) -> list[dict]:
    out = []
    for path in src.containing('name="sglang:'):
        for node in ast.walk(src.tree(path)):
            if isinstance(node, ast.Call) and _callee(node) in ("Counter", "Gauge", "Histogram"):
                name = _const_str(_kw(node, "name") or ast.Constant(None))
                labels = _kw(node, "labelnames")
                if name:
                    out.append({"name": name, "kind": _callee(node).lower(),
                                "labelnames": ast.unparse(labels) if labels is not None else None,
                                "file": src.rel(path)})
    return sorted(out, key=lambda m: (m["name"], m["file"]))


def forward_categories(src: Source) -> list[dict]:
    """Every category a forward pass is timed under, per file and function."""
    out = []
    for path in src.containing("device_timer"):
        for fn in ast.walk(src.tree(path)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                expr = None
                if isinstance(node, ast.Call) and _callee(node) == "device_timer_ctx" and len(node.args) > 1:
                    expr = node.args[1]
                elif (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "category"
                                                           for t in node.targets)):
                    expr = node.value
                if expr is None:
                    continue
                consts = sorted({c.value for c in ast.walk(expr) if _const_str(c) is not None})
                out.append({"file": src.rel(path), "function": fn.name, "line": node.lineno,
                            "expr": ast.unparse(expr), "constants": consts})
    return sorted({(d["file"], d["line"]): d for d in out}.values(),
                  key=lambda d: (d["file"], d["line"]))


def log_formats(src: Source) -> dict:
    out: dict = {}
    for kind, names in (("decode", DECODE_LOG_FUNCS), ("prefill", PREFILL_LOG_FUNCS)):
        for path in src.containing("def " + names[0]) + src.containing("def " + names[1]):
            for fn in src.functions(path, names):
                out[kind] = {"file": src.rel(path), "function": fn.name, "fstrings": _fstrings(fn)}
                text = path.read_text(errors="replace")
                out["graph_labels"] = sorted(set(re.findall(r'"(\w+ graph)"', text)))
                occ = [f for f in src.functions(path, ("log_string",))]
                if occ:
                    out["occupancy_fstrings"] = _fstrings(occ[0])
    usage = ("get_decode_usage_msg_parts", "get_prefill_usage_msg_parts")  # 0.5.23: own module
    for path in src.containing("def " + usage[0]):
        for fn in src.functions(path, usage):
            out.setdefault("usage_fstrings", {})[fn.name] = _fstrings(fn)
    return out


def meta_info_keys(src: Source) -> dict:
    path = next(p for p in src.files("srt/managers") if p.name == "tokenizer_manager.py")
    keys: dict[str, list[str]] = {}
    for fn in ast.walk(src.tree(path)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        found = []
        for node in _in_order(n for n in ast.walk(fn) if hasattr(n, "lineno")):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and node.value.id == "meta_info" and isinstance(node.ctx, ast.Store):
                found.append(_const_str(node.slice))
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "meta_info"
                                                    for t in node.targets) and isinstance(node.value, ast.Dict):
                found += [_const_str(k) for k in node.value.keys if k is not None]
            if isinstance(node, ast.Call) and _callee(node) == "update" and isinstance(
                    node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "meta_info" and node.args and isinstance(node.args[0], ast.Dict):
                found += [_const_str(k) for k in node.args[0].keys if k is not None]
        found = [k for k in found if k]
        if found:
            keys[fn.name] = list(dict.fromkeys(found))
    return {"file": src.rel(path), "by_function": keys}


def http_routes(src: Source) -> dict:
    path = next(p for p in src.files("srt/entrypoints") if p.name == "http_server.py")
    routes, model_info = {}, []
    for fn in ast.walk(src.tree(path)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for dec in fn.decorator_list:
            if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.args \
                    and isinstance(dec.func.value, ast.Name) and dec.func.value.id == "app":
                route = _const_str(dec.args[0])
                methods = ([dec.func.attr.upper()] if dec.func.attr != "api_route" else
                           [_const_str(m) for m in getattr(_kw(dec, "methods"), "elts", [])])
                if route:
                    routes.setdefault(route, {"methods": [], "function": fn.name})
                    routes[route]["methods"] += methods
        if fn.name == "model_info":
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                    model_info = [_const_str(k) for k in node.value.keys if k is not None]
    return {"file": src.rel(path), "routes": dict(sorted(routes.items())),
            "model_info_keys": list(dict.fromkeys(k for k in model_info if k))}


def bench_serving(src: Source) -> dict:
    candidates = [src.pkg / "benchmark" / "serving.py", src.pkg / "bench_serving.py"]
    path = next(p for p in candidates if p.exists() and "async def benchmark(" in p.read_text())
    flags, choices, result_keys = [], {}, []
    for node in ast.walk(src.tree(path)):
        if isinstance(node, ast.Call) and _callee(node) == "add_argument":
            names = [s for s in map(_const_str, node.args) if s and s.startswith("--")]
            flags += names
            ch = _kw(node, "choices")
            if names and isinstance(ch, ast.List | ast.Tuple):
                choices[names[0]] = [_const_str(e) for e in ch.elts]
    for fn in src.functions(path, ("benchmark",)):
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "result"
                                                    for t in node.targets) and isinstance(node.value, ast.Dict):
                result_keys = [_const_str(k) for k in node.value.keys if k is not None]
    return {"file": src.rel(path), "flags": sorted(set(flags)), "choices": choices,
            "result_keys": [k for k in result_keys if k]}


def server_args_fields(src: Source) -> list[str]:
    tree = src.tree(src.pkg / "srt" / "server_args.py")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    return sorted(n.target.id for n in cls.body
                  if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))


def _where(src: Source, pattern: str) -> list[dict]:
    """File, function and line of every statement whose source matches `pattern`."""
    rx = re.compile(pattern)
    out = []
    for path in src.files():
        text = path.read_text(errors="replace")
        if not rx.search(text):
            continue
        for fn in ast.walk(src.tree(path)):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for stmt in fn.body:
                    for node in ast.walk(stmt):
                        if isinstance(node, ast.stmt) and rx.search(ast.unparse(node).split("\n")[0]):
                            out.append({"file": src.rel(path), "function": fn.name,
                                        "line": node.lineno, "code": ast.unparse(node).split("\n")[0]})
    return sorted({(d["file"], d["line"]): d for d in out}.values(), key=lambda d: (d["file"], d["line"]))


def accept_window(src: Source) -> dict:
    """Whether the lifetime accept totals are added to only once per decode-log window: after
    an interval gate inside the log function (0.5.23), or because its only callers call it
    under one (0.5.9)."""
    for path in src.containing("decode_log_interval"):
        for fn in src.functions(path, DECODE_LOG_FUNCS):
            gate = next((n.lineno for n in ast.walk(fn) if isinstance(n, ast.If)
                         and "decode_log_interval" in ast.unparse(n.test)
                         and any(isinstance(b, ast.Return) for b in n.body)), None)
            adds = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.AugAssign)
                    and "spec_total_num_accept" in ast.unparse(n.target)]
            if not adds:
                continue
            callers = []
            for other in src.containing(f".{fn.name}("):
                for node in ast.walk(src.tree(other)):
                    if isinstance(node, ast.If) and "decode_log_interval" in ast.unparse(node.test):
                        calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)
                                 and _callee(c) == fn.name]
                        callers += [{"file": src.rel(other), "line": c.lineno,
                                     "gate": ast.unparse(node.test)} for c in calls]
            inner = gate is not None and min(adds) > gate
            return {"file": src.rel(path), "function": fn.name, "interval_gate_line": gate,
                    "total_update_lines": adds, "gated_callers": callers,
                    "totals_only_per_window": inner or bool(callers)}
    return {}


def source_facts(pkg: Path) -> dict:
    src = Source(pkg)
    return {
        "metrics": metrics(src),
        "forward_categories": forward_categories(src),
        "log_formats": log_formats(src),
        "meta_info": meta_info_keys(src),
        "http": http_routes(src),
        "bench_serving": bench_serving(src),
        "server_args_fields": server_args_fields(src),
        "accept_window": accept_window(src),
        "verify_calls_increment": _where(src, r"spec_verify_calls_total\.labels\("),
        "decode_pass_increment": _where(src, r"increment_(decode_)?cuda_graph_pass\("),
    }


# -- running the installed package -------------------------------------------------------------
PROBE = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args
checks = json.load(sys.stdin)
out = []
for check in checks:
    p = argparse.ArgumentParser(prog="launch_server")
    ServerArgs.add_cli_args(p)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            p.parse_args(check["argv"])
        out.append({**check, "accepted": True, "error": None})
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        out.append({**check, "accepted": False, "exit_code": exc.code, "error": lines[-1] if lines else ""})
keys = None
try:
    from sglang.srt.entrypoints.http_server import build_server_info
    keys = sorted(build_server_info(prepare_server_args(checks[0]["argv"]), {}))
except Exception as exc:
    keys = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps({"checks": out, "server_info_keys": keys}))
"""


def sleuth_argvs() -> list[dict]:
    """sleuth's own launch argv for the shipped SGLang configs, spelled for 0.5.23."""

    from orchestrator.config.compose import compose_settings
    from orchestrator.config.settings import as_dict
    from orchestrator.targets.base import NodeContext
    from orchestrator.targets.sglang import SglangTarget

    def argv(*overrides: str) -> list[str]:
        cfg = compose_settings("trial", ["target=sglang_kimi_k25_eagle3", "target.sglang_version=0.5.23",
                                       *overrides])
        conf = as_dict(cfg.target)
        bench = as_dict(cfg.bench)
        node = NodeContext("fixtures", Path(tempfile.gettempdir()) / "sleuth-fixtures")
        return SglangTarget(conf, bench, node).server_args(30000)

    return [
        {"name": "kimi_k25_eagle3", "overrides": [], "argv": argv()},
        {"name": "kimi_k25_eagle3 cuda_graph_max_bs=32 disable_cuda_graph decode_log_interval=10",
         "overrides": ["target.cuda_graph_max_bs=32", "target.disable_cuda_graph=true",
                       "target.decode_log_interval=10"],
         "argv": argv("target.cuda_graph_max_bs=32", "target.disable_cuda_graph=true",
                      "target.decode_log_interval=10")},
        {"name": "removed --cuda-graph-max-bs (0.5.13 spelling)", "overrides": [],
         "argv": [*argv(), "--cuda-graph-max-bs", "32"]},
        {"name": "deprecated --disable-cuda-graph", "overrides": [],
         "argv": [*argv(), "--disable-cuda-graph"]},
    ]


def scrubber(python: str):
    """Replace this machine's paths (the venv, site-packages, home, temp) with placeholders."""
    out = subprocess.run([python, "-c", "import sys, sysconfig; print(sys.prefix);"
                          " print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.split()
    pairs = [(out[1], "<site-packages>"), (out[0], "<sglang-venv>"),
             (os.path.expanduser("~"), "<home>"), (tempfile.gettempdir(), "<tmp>")]

    def scrub(text: str) -> str:
        for path, name in pairs:
            if path and len(path) > 1:
                text = text.replace(path, name)
        return re.sub(r"\x1b\[[0-9;]*m", "", text)

    return scrub


def live_facts(python: str, out_dir: Path) -> Path:
    scrub = scrubber(python)
    info = json.loads(subprocess.run(
        [python, "-c", "import json, sglang, os; print(json.dumps({'version': sglang.__version__,"
         " 'pkg': os.path.dirname(sglang.__file__)}))"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    target = out_dir / ("sglang_" + info["version"].replace(".", "_"))
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cwd:
        help_run = subprocess.run([python, "-m", "sglang.launch_server", "--help"], cwd=cwd,
                                  capture_output=True, text=True, check=True)
        (target / "launch_server_help.txt").write_text(scrub(help_run.stdout))
        probe = subprocess.run([python, "-c", PROBE], cwd=cwd, input=json.dumps(sleuth_argvs()),
                               capture_output=True, text=True, check=True)
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    (target / "argv_checks.json").write_text(scrub(json.dumps(result["checks"], indent=1)) + "\n")
    (target / "server_info_keys.json").write_text(
        scrub(json.dumps(result["server_info_keys"], indent=1)) + "\n")
    write_source_facts(Path(info["pkg"]), info["version"], target, scrub)
    return target


def write_source_facts(pkg: Path, version: str, target: Path, scrub=lambda s: s) -> None:
    facts = {"sglang_version": version, "generated_by": "experiments/sglang_fixtures.py",
             **source_facts(pkg)}
    target.mkdir(parents=True, exist_ok=True)
    (target / "source_facts.json").write_text(scrub(json.dumps(facts, indent=1)) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", help="interpreter that has sglang installed")
    p.add_argument("--source", help="an unpacked `sglang` package directory (source facts only)")
    p.add_argument("--version", help="with --source: the release it is")
    p.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.python:
        print(f"wrote {live_facts(a.python, out)}")
    elif a.source and a.version:
        target = out / ("sglang_" + a.version.replace(".", "_"))
        home = os.path.expanduser("~")
        write_source_facts(Path(a.source), a.version, target,
                           lambda s: s.replace(str(Path(a.source).resolve()), "<src>").replace(home, "<home>"))
        print(f"wrote {target}")
    else:
        p.error("give --python PATH, or --source DIR --version X.Y.Z")
    return 0


if __name__ == "__main__":
    sys.exit(main())
