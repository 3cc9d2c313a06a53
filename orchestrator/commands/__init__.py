"""One module per CLI command, each with a plain `run(cfg, ...) -> int` that tests call."""
