"""What checking a cached overlay on reuse costs: the files' signature (every reuse) and the
wheel's RECORD (only when the signature differs), on a real wheel.

    python -m experiments.overlay_check_cost WHEEL_DIR NAME==VERSION [REPEATS]

builds the overlay of NAME==VERSION from WHEEL_DIR into a temporary cache (pip, isolated,
offline) and prints the median seconds of each check over REPEATS (default 20) runs, with the
overlay's file count and size.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time


def main(wheels: str, pin: str, repeats: int = 20) -> None:
    from orchestrator.packages import integrity
    from orchestrator.packages.overlay import OverlayCache, OverlaySettings
    from orchestrator.workspace.cache import disk_usage

    with tempfile.TemporaryDirectory() as cache_dir:
        cache = OverlayCache(OverlaySettings(cache_dir, find_links=(wheels,)))
        began = time.monotonic()
        overlay = cache.ensure(pin)
        built = time.monotonic() - began
        files = sum(1 for p in overlay.path.rglob("*") if p.is_file())

        def timed(fn) -> float:
            out = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
            return statistics.median(out)

        sig = timed(lambda: integrity.signature(overlay.path))
        full = timed(lambda: integrity.check(overlay.path, overlay.name))
        reuse = timed(lambda: cache.ensure(pin))
        print(f"{pin}: {files} files, {disk_usage(overlay.path) / 2**20:.0f} MiB, built in"
              f" {built:.1f} s; signature {sig * 1000:.1f} ms, RECORD check {full * 1000:.0f} ms,"
              f" a reuse (key + signature) {reuse * 1000:.1f} ms (medians of {repeats})")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python -m experiments.overlay_check_cost WHEEL_DIR NAME==VERSION [REPEATS]")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else 20)
