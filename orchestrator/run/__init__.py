"""Run bookkeeping: run directories, findings documents (bisect, isolate, sweep), what a run cost,
and the noise prior read from a node's earlier runs."""
