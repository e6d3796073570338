"""Benchmark cases, one module per area, run by the bench/*.py entry points."""
