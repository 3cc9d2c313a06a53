"""A reference from an old server log (`reference=log:PATH`, `sleuth trial from_log=PATH`).

The engineer in the seed had no sleuth run from when the node was fast, only its logs. An
SGLang log holds much of "then": the resolved server configuration (`server_args=`), every
decode-log window (accept length, generation throughput), with `NCCL_DEBUG=INFO` the NCCL
release and every NCCL setting taken from the environment, and whatever custom instrumentation
printed (`log.pattern='verify (?P<verify_ms>[0-9.]+) ms'`). It does not hold clocks, power,
the driver, package versions other than NCCL, the variables NCCL does not report, or the
commit; those are stated as unknown, never guessed.

- `lines`      one line at a time: the timestamp prefix, `server_args=` (dict or repr, read
               with `ast`, never `eval`), decode/prefill lines, NCCL INFO lines, user patterns
- `files`      which files, in which order (several paths, globs, rotated `.1`, `.gz`)
- `parsed`     the log as server lifetimes (each `server_args=` starts one) and their samples
- `server_args` the logged configuration as the target's settings (and the rest, listed)
- `record`     the reference record the compare, isolate and investigate take
- `diff`       a log's partial fingerprint against a trial's: known differences, and unknowns
- `stored`     `sleuth trial from_log=PATH run_id=NAME`: the reference kept as a run
"""
