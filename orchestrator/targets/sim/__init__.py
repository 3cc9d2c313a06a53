"""The embedded simulated SGLang node (`target=sim`), server side.

`python -m orchestrator.targets.sim` runs an HTTP server that speaks SGLang's surfaces and
whose timings follow the EAGLE-3 performance model, driven by the repo's `sim_profile.json`
(+ `sim_profile.d/`), the process environment and a GPU state file. Modules:

- `model`      pure performance model: `predict()`, `expected_request_ms()`, `PassCostModel`
- `acceptance` pure draft-acceptance model (re-exported by `model`)
- `comm`       NCCL / CUDA environment -> all-reduce cost, invalid values -> start failure
- `gpu_state`  the GPU state file: `load`, `save` (atomic), `default_state`
- `profile`    profile fragments: `load_fragments`, `resolve_effects`, `Effects`
- `args`       SGLang + `--sim-*` flags (env fallback `SLEUTH_SIM_*`), `parse()`
- `dialect`    which SGLang release it imitates (`--sim-sglang-version`: 0.5.23, or 0.5.9)
- `app`, `endpoints`, `scheduler`, `metrics`, `requests`, `tokens`, `logs`, `noise`, `faults`
- `launcher`   start/stop a sim process for tests and tools (`run_sim`)
- `loadclock`  the loading phase's modeled sleeps, counted from the process's launch

The scenarios it plays (planted-cause repositories, system stories) and the noise-free
oracles over its model live in `orchestrator/sim_scenarios/`, which imports this package,
never the other way round.

Importing this package must stay cheap: every trial launches the server.
"""
