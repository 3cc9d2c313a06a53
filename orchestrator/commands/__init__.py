"""One module per CLI command, each with a plain `run(settings: RunSettings, ...) -> int` that
tests call (`orchestrator.config.compose.compose_settings` builds the settings as the CLI does)."""
