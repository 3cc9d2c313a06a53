"""How often the kernel evidence names the planted family, on real simulated servers.

For each seeded story and each kind of planted cause, the two sides are launched as real sim
server processes (`--sim-seed` differs per restart, so each restart draws its own restart-level,
per-family and per-pass noise), profiled through `/start_profile` + `/stop_profile` while a
fixed request set runs, and diffed by `orchestrator.evidence.kernels.diff` exactly as an
investigation does. A story counts as right when the top mover is the planted family with an
interval that excludes zero (for the harmless change: when no family moved at all). A side
with outlier restarts gets replacements as the evidence step gives them (at most `restarts`
extra a side).

Kinds (their sizes drawn per story from the ranges the scenario presets plant):
  commit    a commit that slows verify attention (`verify_mult` 1.15 .. 1.53) -> attention
  power     power limit 600 W -> 400 .. 480 W                                 -> GEMM
  nccl      NCCL_PROTO=LL128 dropped (the sim prices it, plus a code effect)  -> all-reduce
  harmless  an unrelated variable changed                                     -> no mover

    .venv/bin/python experiments/kernel_evidence_check.py --stories 20 --restarts 3
    .venv/bin/python experiments/kernel_evidence_check.py --stories 20 --outlier-rate 0.1

Prints one line per story and the share right per kind.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.evidence import kernels as K  # noqa: E402
from orchestrator.evidence.trace import read_profile  # noqa: E402
from orchestrator.targets.sim import gpu_state  # noqa: E402
from tests.sim_client import run_sim  # noqa: E402

EXPECTED = {"commit": "attention", "power": "gemm", "nccl": "allreduce", "harmless": None}
BASE_ARGS = ["--tp-size", "8", "--sim-time-scale", "0.02", "--sim-load-seconds", "1",
             "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]  # fmt: skip
NCCL_EFFECT = {"env_effects": [{"var": "NCCL_PROTO", "value": "LL128", "allreduce_mult": 0.65}]}


def _post(url: str, body: dict | None) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def _side(kind: str, which: str, rng: random.Random, work: Path) -> tuple[Path, dict, list[str]]:
    """(checkout dir, env, extra args) of one side of a story."""
    d = work / which
    d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ}
    args: list[str] = []
    profile: dict = {}
    if kind == "commit" and which == "after":
        profile = {"verify_mult": rng.uniform(1.15, 1.53)}
    if kind == "nccl":
        profile = NCCL_EFFECT
        if which == "before":
            env["NCCL_PROTO"] = "LL128"
        else:
            env.pop("NCCL_PROTO", None)
    if kind == "power" and which == "after":
        state = gpu_state.default_state().with_all_gpus(power_limit_w=rng.uniform(400.0, 480.0))
        gpu_state.save(d / "gpu_state.json", state)
        args += ["--sim-gpu-state", str(d / "gpu_state.json")]
    if kind == "harmless":
        env["SOME_UNRELATED_SETTING"] = which
    (d / "sim_profile.json").write_text(json.dumps(profile))
    return d, env, args


def profile_once(cwd: Path, env: dict, args: list[str], seed: int, out: Path, cv: dict) -> bytes:
    noise = ["--sim-seed", str(seed), "--sim-noise-restart-cv", str(cv["restart"]),
             "--sim-noise-request-cv", str(cv["request"]),
             "--sim-noise-outlier-rate", str(cv["outlier_rate"])]
    with run_sim([*BASE_ARGS, *noise, *args], cwd=cwd, log_path=out / f"{seed}.log",
                 env=env) as sim:
        _post(sim.base_url + "/start_profile",
              {"output_dir": str(out), "profile_id": str(seed), "with_stack": False})
        for i in range(4):
            sim.post_json("/generate", {"input_ids": list(range(100 + i, 164 + i)),
                                        "sampling_params": {"max_new_tokens": 48,
                                                            "ignore_eos": True}})
        _post(sim.base_url + "/stop_profile", None)
    return (out / f"{seed}-TP-0.trace.json.gz").read_bytes()


def story(kind: str, n: int, restarts: int, cv: dict) -> tuple[bool, str]:
    rng = random.Random(f"{kind}-{n}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sides = {w: _side(kind, w, rng, work) for w in ("before", "after")}
        got: dict[str, list] = {"before": [], "after": []}
        launched = {"before": 0, "after": 0}

        def missing(w: str) -> int:  # as orchestrator/evidence/collect.py tops a side up
            good = len(got[w]) - len(K.outlier_restarts(got[w]))
            return min(max(0, restarts - good), 2 * restarts - launched[w])

        while True:
            need = {w: missing(w) for w in got}
            if not any(need.values()):
                break
            for i in range(max(need.values())):
                for w in ("before", "after"):  # interleaved, as the evidence step runs them
                    if i >= need[w]:
                        continue
                    cwd, env, args = sides[w]
                    seed = zlib.crc32(f"{kind}-{n}-{w}-{launched[w]}".encode()) % (1 << 31)
                    launched[w] += 1
                    got[w].append(read_profile(profile_once(cwd, env, args, seed, work, cv)))
        d = K.diff(got["before"], got["after"])
    want = EXPECTED[kind]
    if want is None:
        return not d.movers, K.evidence_line(d)
    top = d.top
    ok = top is not None and top.family == want and (top.ci[0] > 0 or top.ci[1] < 0)
    return ok, K.evidence_line(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stories", type=int, default=20)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--kinds", default="commit,power,nccl,harmless")
    ap.add_argument("--restart-cv", type=float, default=0.02)
    ap.add_argument("--request-cv", type=float, default=0.01)
    ap.add_argument("--outlier-rate", type=float, default=0.0)
    a = ap.parse_args(argv)
    cv = {"restart": a.restart_cv, "request": a.request_cv, "outlier_rate": a.outlier_rate}
    summary = {}
    for kind in a.kinds.split(","):
        right = 0
        for n in range(a.stories):
            ok, line = story(kind, n, a.restarts, cv)
            right += ok
            print(f"{kind:8s} {n:2d} {'ok ' if ok else 'BAD'} {line}", flush=True)
        summary[kind] = right
    for kind, right in summary.items():
        print(f"{kind}: {right}/{a.stories} right ({right / a.stories:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
