"""Package versions as a factor: pins, overlays, and what a server really imported.

A candidate may pin packages (`nvidia-nccl-cu12==2.27.5`). A trial never installs into the
node's environment: each pin is installed once, with `pip install --no-deps --target`, into an
*overlay* directory of its own under `runs_dir/.cache/overlays/` (:mod:`.overlay`), and the
trial puts the overlays first on the server's `PYTHONPATH` (and their native library
directories first on `LD_LIBRARY_PATH`). Once the server is up, the versions it really imported
are read from the server itself (:mod:`.probe`; the sim reports its own), and a pin that did not
take effect makes the trial `env_mismatch`, never a measurement (:mod:`.trial`).
"""
