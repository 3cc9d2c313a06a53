"""Capture one profile at the end of a trial, after its measured repetitions (runs on the node).

Profiling slows a server down (the torch profiler records every kernel), so it never overlaps a
measurement: the trial runs its repetitions exactly as an unprofiled one, then, with the same
server still up, asks it for a profile of a short extra load, and stores the trace in the trial
directory as `kernels.trace.json.gz` (gzip; SGLang writes it compressed already). A profile that
fails (an old server without the endpoints, a full /tmp, a crash) is recorded in the trial's
fingerprint under `profile.error` and never changes the trial's outcome or its numbers.

Two ways to get a trace:

- `http`: SGLang's `/start_profile` + `/stop_profile` (and the sim's imitation). The request
  asks for host and device activity (the host step spans say which forward mode a kernel ran
  in), no stacks and no shapes (smaller traces; nothing here reads them), and an `output_dir`
  inside the trial directory. SGLang writes one file per TP rank; rank 0 is kept (ranks run the
  same kernels in lockstep; the others are deleted to keep the run directory small).
- `file`: a benchmark command that writes a torch profiler / Chrome trace itself; sleuth names
  the file in `SLEUTH_PROFILE_TRACE` (target=command, see `targets/command.py`).
"""

from __future__ import annotations

import gzip
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from orchestrator.evidence.trace import TraceError, read_profile

TRACE_NAME = "kernels.trace.json.gz"
TRACE_ENV = "SLEUTH_PROFILE_TRACE"  # target=command: where the bench should write its trace
RAW_DIR = "profile-raw"


class CaptureError(RuntimeError):
    pass


def start_request(output_dir: Path, profile_id: str) -> dict[str, Any]:
    """The `/start_profile` body (fields of SGLang 0.5.23's `ProfileReq`)."""
    return {"output_dir": str(output_dir), "activities": ["CPU", "GPU"], "with_stack": False,
            "record_shapes": False, "profile_id": profile_id}


def capture_http(client: httpx.Client, base_url: str, trial_dir: Path,
                 run_load: Callable[[], None], timeout_s: float = 120.0) -> dict[str, Any]:
    """Profile `run_load()` on a running server through the target's `client`; returns the
    trace's summary (see `summary`)."""
    raw = trial_dir / RAW_DIR
    raw.mkdir(parents=True, exist_ok=True)
    profile_id = f"sleuth-{trial_dir.name}-{int(time.time())}"
    r = client.post(base_url + "/start_profile", json=start_request(raw.resolve(), profile_id),
                    timeout=timeout_s)
    if r.status_code != 200:
        raise CaptureError(f"/start_profile answered {r.status_code}: {r.text.strip()[:200]}")
    try:
        run_load()
    finally:
        r = client.post(base_url + "/stop_profile", timeout=timeout_s)
    if r.status_code != 200:
        raise CaptureError(f"/stop_profile answered {r.status_code}: {r.text.strip()[:200]}")
    files = sorted(raw.glob(f"*{profile_id}-TP-*.trace.json*"))
    if not files:
        raise CaptureError(f"the server wrote no trace for profile id {profile_id}")
    keep = next((f for f in files if "-TP-0" in f.name), files[0])
    try:
        return store(keep.read_bytes(), trial_dir, source=keep.name)
    finally:
        shutil.rmtree(raw, ignore_errors=True)


def store(data: bytes, trial_dir: Path, source: str = "") -> dict[str, Any]:
    """Keep a trace (compressed) in the trial directory; returns its summary."""
    if data[:2] != b"\x1f\x8b":
        data = gzip.compress(data, compresslevel=5)
    profile = read_profile(data, source)  # refuse a file that is not a trace before keeping it
    (trial_dir / TRACE_NAME).write_bytes(data)
    return summary(profile, len(data))


def summary(profile, n_bytes: int) -> dict[str, Any]:
    return {"trace": TRACE_NAME, "bytes": n_bytes, "passes": dict(profile.passes),
            "source": profile.source}


def capture_file(path: Path, trial_dir: Path) -> dict[str, Any]:
    """A trace the benchmark wrote itself (`SLEUTH_PROFILE_TRACE`)."""
    if not path.is_file():
        raise CaptureError(f"the benchmark wrote no trace at {TRACE_ENV}={path}")
    return store(path.read_bytes(), trial_dir, source=path.name)


def guarded(capture: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a capture; any failure becomes `{"error": ...}` (a profile never fails a trial)."""
    try:
        return capture()
    except (CaptureError, TraceError, OSError, httpx.HTTPError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    except Exception as exc:  # noqa: BLE001 - a bench's own failure in the profiled load
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def wanted(extra: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The profile settings a trial spec carries (`extra["profile"]`), or None."""
    settings = extra.get("profile") if isinstance(extra, Mapping) else None
    return settings if isinstance(settings, Mapping) else None
