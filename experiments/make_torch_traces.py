"""Make the CPU torch profiler traces under tests/fixtures/traces/torch_cpu/ (needs a CPU build
of torch in the interpreter that runs it; sleuth itself never imports torch).

    python experiments/make_torch_traces.py OUT_DIR

A small training bench: a two-layer block with an attention (torch's SDPA on one side,
`matmul + softmax + matmul` written out on the other, both in the same step), its backward and an
optimizer step. On a CPU the backward runs on the thread that calls it (a plain Python thread
would not be recorded at all: it does not inherit the profiler's thread-local state), so the
second launching thread of a CUDA trace (autograd's device thread) is made when the tests
relabel these traces (tests/kineto_traces.py). `fast` and `slow` differ in the hidden size (slow does about 2.5x the
work). Each restart is a separate process, so every trace is one restart. Traces are written
as the profiler exports them (`export_chrome_trace`), gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, torch
from torch.profiler import ProfilerActivity, profile, schedule
torch.manual_seed(int(sys.argv[3]))
torch.set_num_threads(1)
hidden = int(sys.argv[2])
lin1, lin2 = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)
opt = torch.optim.SGD([*lin1.parameters(), *lin2.parameters()], lr=0.01)
x = torch.randn(4, 16, hidden)

def step():
    q = lin1(x).view(4, 16, 2, hidden // 2).transpose(1, 2)
    a = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    w = torch.softmax(q @ q.transpose(-1, -2) / 8.0, dim=-1)
    b = w @ q
    loss = lin2((a + b).transpose(1, 2).reshape(4, 16, hidden)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()

for _ in range(3):  # warm-up outside the profile (allocator, thread pools)
    step()
# exported when the active steps end (after `with`, the profiler has cleared them: an export
# there writes a trace with no events, which sleuth refuses as an empty profile)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
             record_shapes=False, with_stack=False,
             on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for _ in range(3):
        step()
        prof.step()
"""

SIDES = {"fast": 64, "slow": 160}


def main(out: Path, restarts: int = 3) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for side, hidden in SIDES.items():
        for i in range(restarts):
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "trace.json"
                subprocess.run([sys.executable, "-c", CHILD, str(raw), str(hidden), str(i)],
                               check=True)
                doc = json.loads(raw.read_text())
            data = json.dumps(doc, separators=(",", ":")).encode()
            (out / f"{side}-{i}.trace.json.gz").write_bytes(gzip.compress(data, mtime=0))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
