"""Presentation: console rendering, live progress, per-command help, reports."""
