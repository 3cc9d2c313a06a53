"""Benchmark client and metric parsers (client side and server side)."""
