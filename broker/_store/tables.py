"""Every family of tables together: what the implementations of the port share.

Theory of operation. Each family (`catalog`, `endpoints`, `messages`, `transmission`,
`remote`, `security`, `outcomes`, `logs`) writes into the open batch and reads through
the `commit.Connection` it is given, with SQL that both SQLite and PostgreSQL run as
written (`?` placeholders, which the PostgreSQL session turns into its own). `AllTables`
is them all; an implementation adds the commit machinery (`commit.Committer`) and the
connections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from .._core.ports import Row
from . import endpoints, messages, transmission
from .catalog import CatalogTables
from .endpoints import EndpointTables
from .logs import LogTables
from .messages import MessageTables
from .outcomes import OutcomeTables
from .remote import RemoteTables
from .security import SecurityTables
from .transmission import TransmissionTables

# the inserts of the hot tables, which SQLite writes many rows to a statement
# (statement -> columns a row binds)
MULTI_ROW: Final[Mapping[str, int]] = {
    **messages.MULTI_ROW,
    **transmission.MULTI_ROW,
    **endpoints.MULTI_ROW,
}
# statement -> the rows one of its parameter rows touches, where that is not one
ROW_COUNTS: Final[Mapping[str, Callable[[Row], int]]] = {
    **messages.ROW_COUNTS,
    **transmission.ROW_COUNTS,
}


class AllTables(
    CatalogTables,
    EndpointTables,
    MessageTables,
    TransmissionTables,
    RemoteTables,
    SecurityTables,
    OutcomeTables,
    LogTables,
):
    """The families of tables, over the connections an implementation makes."""
