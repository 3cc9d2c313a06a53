"""Evidence below the phase: profiler traces of a named cause's two sides, diffed per kernel."""
