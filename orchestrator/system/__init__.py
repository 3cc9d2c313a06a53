"""System-level concepts: fingerprints, their diffs, the differences a strategy can toggle,
system changes between trials, env checks, mechanism ranking, secret redaction."""
