"""What an activated procedure may know of its own run, and how it reports a failure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What an activated procedure may want to know about its own run."""

    queue: str
    task_id: int
    procedure: str
    execute_as: str
    database: str = "master"


class ProcedureFailed(Exception):
    """Raised by an entry point that has already written why its procedure failed: the
    worker reports the message as the task's error, without a traceback."""
