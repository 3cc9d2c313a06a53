"""Benchmarks and experiments that exercise sleuth's strategies against virtual oracles."""
