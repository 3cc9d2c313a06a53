"""Run bookkeeping: run directories, findings documents (bisect, isolate, sweep), what a run cost."""
