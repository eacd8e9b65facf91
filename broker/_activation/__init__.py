"""Activation: queue monitors (`monitor`, pure), the manager that acts on them
(`manager`), the worker processes that run procedures (`workers`), and the seed-000
scheduler's execution log (`execution_log`)."""
