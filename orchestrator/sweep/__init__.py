"""`sleuth sweep`: Optuna search over env / server / clock settings, measured over restarts.

  space.py       search spaces from `conf/space/` (conditional parameters, candidates)
  study.py       the Optuna study (RDB storage in the run directory) and samplers
  search.py      the experiment: baseline, search, pruning, leaders, interleaved confirmation
  noise.py       restart noise and the pruning rule
  effects.py     the additive model of every restart (per-setting effects, predictions)
  importance.py  parameter importance through Optuna's evaluators
  report.py      findings.json and the console tables
  oracle.py      a virtual trial from the sim's model, for the benchmark and tests
  benchmark.py   `python -m orchestrator.sweep.benchmark`: how often a sweep finds the best
"""
