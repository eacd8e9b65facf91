"""Which Python functions the broker's workers may run: the operator's list, nothing else.

Python activation procedures and scheduler tasks are named `package.module:function` by
whoever creates the queue or queues the task, and run inside the broker's worker
processes with the daemon's OS user. So the broker runs only what the operator lists
in the config (`procedures = ["myapp.tasks.*", "reports:daily"]`, fnmatch patterns):
a pattern with a ':' is matched against the whole `module:function`, one without
against the module (`myapp.tasks.*` also covers `myapp.tasks` itself). The
scheduler's own reader is always allowed; the tasks it runs are checked one by one
(`check_procedure`, asked by the reader before it imports anything). CREATE / ALTER
QUEUE refuse an activation procedure outside the list; an activation whose procedure
left the list fails with that reason instead of starting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from typing import Any, Final

from ssb.protocol import ErrorCode

from ._core.transactions import Session
from ._errors import BrokerError

log = logging.getLogger("ssb.procedures")

# the scheduler's reader: broker code that runs only checked tasks
BUILT_IN: Final = ("ssb.client._scheduler:run_tasks",)
# what a worker runs for an activation procedure written in T-SQL: the interpreter,
# given the procedure's name (a T-SQL procedure runs no code outside it, so it needs no
# place in the operator's list)
TSQL_ENTRY: Final = "ssb.tsql._activation:run"


class ProcedurePolicy:
    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)

    def allows(self, spec: str) -> bool:
        if spec in BUILT_IN:
            return True
        module = spec.partition(":")[0]
        for pattern in self.patterns:
            if ":" in pattern:
                if fnmatchcase(spec, pattern):
                    return True
            elif fnmatchcase(module, pattern) or (
                pattern.endswith(".*") and module == pattern[:-2]
            ):
                return True
        return False

    def check(self, spec: str, what: str = "procedure", user: str = "") -> None:
        """Raise PERMISSION_DENIED, saying how to allow it, unless `spec` may run."""
        if self.allows(spec):
            return
        listed = ", ".join(repr(p) for p in self.patterns) or "none"
        log.warning(
            "refused %s %r%s: not in the config's procedures",
            what,
            spec,
            f" for {user!r}" if user else "",
        )
        raise BrokerError(
            ErrorCode.PERMISSION_DENIED,
            f"{what} {spec!r} is not one the broker may run (allowed: {listed}); the"
            ' operator lists them in the config, e.g. procedures = ["myapp.tasks.*"]',
        )

    def operations(self) -> dict[str, Callable[..., Any]]:
        return {"check_procedure": self._check_procedure}

    def _check_procedure(self, session: Session, procedure: object) -> None:
        """Operation: a reader asks before it imports a task's function."""
        if not isinstance(procedure, str) or not 0 < len(procedure) <= 1024:
            raise BrokerError(ErrorCode.BAD_ARGUMENT, "check_procedure needs 'module:function'")
        self.check(procedure, "task", session.user)
