"""The embedded simulated SGLang node (`target=sim`), server side.

`python -m orchestrator.targets.sim` runs an HTTP server that speaks SGLang's surfaces and
whose timings follow the EAGLE-3 performance model in `model.py`, driven by the repo's
`sim_profile.json` (+ `sim_profile.d/`), the process environment and a GPU state file.
Importing this package must stay cheap: every trial launches the server.
"""
