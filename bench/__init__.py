"""Benchmarks for the ssb broker: `python -m bench.e2e`, `python -m bench.priorities`."""
