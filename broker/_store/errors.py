"""The store's exceptions: one root, `StoreError`, for whatever a caller may catch.

Callers never see the database's own exception types: the store translates them at the
points where a caller can do something about a failure (opening, closing, measuring
free space, the reads of a metrics scrape). A commit that fails on the store thread is
reported through the callbacks given to `attach`, with the database's exception, which
`describe_failure` puts into words.
"""

from __future__ import annotations

import sqlite3
from typing import Final


class StoreError(RuntimeError):
    """The store could not do what was asked (the message says what failed)."""


class StoreUnavailable(StoreError):
    """The store cannot be opened (the message says why and what to do)."""


class StoreFailure(StoreError):
    """A batch cannot be committed and retrying will not help; memory is ahead of disk."""


class LeaseLost(StoreFailure):
    """This daemon no longer holds the broker's lease on its database (another has taken
    it over, or it may have lapsed): it may commit nothing more."""


# the SQLSTATE of the database's refusal of a commit whose lease has passed to another
# daemon (raised by the function `ssb_fence`, see `postgres_schema`)
LEASE_LOST_STATE: Final = "SSB01"


def lease_lost(exc: BaseException) -> bool:
    """Whether a failed commit failed because this daemon no longer holds the lease."""
    return isinstance(exc, LeaseLost) or getattr(exc, "sqlstate", None) == LEASE_LOST_STATE


# what a read on one of the store's connections raises when the database fails: SQLite's
# own errors, or a StoreError (the PostgreSQL session translates its driver's)
READ_ERRORS: Final = (sqlite3.Error, StoreError)


def describe_failure(exc: BaseException) -> str:
    """A store error in words, on one line: its text and the database's own name or code
    for it, when it has one."""
    name = getattr(exc, "sqlite_errorname", None) or getattr(exc, "sqlstate", None)
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{text} ({name})" if name else text
