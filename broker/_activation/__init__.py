"""Activation: the queue monitors' state machines and rule (`monitor`, pure), the
broker's monitors and activated tasks that the core reports to (`monitors`), the
manager that acts on them (`manager`), the worker processes that run procedures
(`workers`), and the seed-000 scheduler's execution log (`execution_log`)."""
