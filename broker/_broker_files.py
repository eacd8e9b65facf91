"""The files a broker's first start makes, kept in its store: the store alone is the broker.

Theory of operation. A broker's first start makes files in its data directory: the broker
key and certificate (and later a staged next pair and the previous keys, see
`_transport/identity.py`), the client port's TLS certificate and key (unless the config
names its own) and `admin.password`. The store keeps a copy of each (`broker_files`), and
the store's copy is the broker's: at every start `restore` writes the store's files into
the data directory (replacing what differs, removing a kept file the store no longer
has) before anything reads them, and `save` puts into the store what the start made or
an operation changed. So a daemon started with an empty data directory on a database
that another daemon has served is the same broker as that one: the same instance id
(in the store already), keys, certificates and admin password; and a data directory
copied from elsewhere cannot make a broker another one.

A file name read from the store is written only if it is one of the kept names (`KEPT`):
the store cannot write elsewhere. Every file is written private (0600). `forget` stops
keeping a file (admin.password, once admin's password has changed: the first start's
is no secret worth keeping then): the store keeps an empty body for it, which neither
`restore` nor `save` touches again, and the file in the data directory is left alone.
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from ._logins import PASSWORD_FILE, write_secret_file
from ._tls import CERT_FILE as TLS_CERT_FILE
from ._tls import KEY_FILE as TLS_KEY_FILE
from ._transport.identity import IDENTITY_PATTERNS

log = logging.getLogger("ssb.daemon")

TLS_FILES: Final = (TLS_CERT_FILE, TLS_KEY_FILE)
KEPT: Final = (*IDENTITY_PATTERNS, *TLS_FILES, PASSWORD_FILE)
MAX_FILE_BYTES: Final = 64 * 1024  # a key, a certificate or a password is far smaller


class FileSource(Protocol):
    """Where the kept files are read from (the store; a standby's lease session)."""

    def load_broker_files(self) -> dict[str, str]: ...


@runtime_checkable
class FileRows(FileSource, Protocol):
    """What saving needs of the store."""

    def put_broker_file(self, name: str, body: str) -> None: ...

    def delete_broker_file(self, name: str) -> None: ...


class BrokerFiles:
    """The kept files of one data directory and their copy in the store."""

    def __init__(self, data_dir: Path, store: FileSource, own_tls: bool) -> None:
        """`own_tls`: the client port's certificate and key are the broker's own (made
        on first start), not files the config names."""
        self.data_dir = data_dir
        self.store = store
        self.patterns = KEPT if own_tls else tuple(p for p in KEPT if p not in TLS_FILES)
        self.kept: dict[str, str] = {}  # what the store holds, as last read or written

    def _is_kept(self, name: str) -> bool:
        return "/" not in name and any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def _present(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for path in self.data_dir.iterdir():
            name = path.name
            if self._is_kept(name) and path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                found[name] = path.read_text(encoding="utf-8")
        return found

    def restore(self) -> None:
        """Make the data directory's kept files the store's (nothing when the store has
        none yet: a first start, or a broker whose files predate this)."""
        kept: dict[str, str] = {}
        for name, body in self.store.load_broker_files().items():
            if self._is_kept(name):
                kept[name] = body
            elif not any(fnmatch.fnmatchcase(name, p) for p in KEPT) or "/" in name:
                log.warning("ignoring a file of the store that is not a broker file: %r", name)
        self.kept = kept
        if not kept:
            return
        present = self._present()
        written = 0
        for name, body in kept.items():
            if body and present.get(name) != body:
                write_secret_file(self.data_dir / name, body)
                written += 1
        for name in present.keys() - kept.keys():
            if any(fnmatch.fnmatchcase(name, p) for p in IDENTITY_PATTERNS):
                (self.data_dir / name).unlink(missing_ok=True)  # a pair staged or rotated away
        if written:
            log.info(
                "wrote %d of the broker's files from its store into %s", written, self.data_dir
            )

    def save(self) -> None:
        """Put the kept files of the data directory into the store's open batch where they
        differ from its copy, and forget in the store those that are gone."""
        store = self.store
        assert isinstance(store, FileRows), "restore only: the source cannot keep files"
        present = self._present()
        forgotten = {name for name, body in self.kept.items() if not body}
        for name, body in present.items():
            if name not in forgotten and self.kept.get(name) != body:
                store.put_broker_file(name, body)
        for name in self.kept.keys() - present.keys() - forgotten:
            store.delete_broker_file(name)
        self.kept = {**present, **dict.fromkeys(forgotten, "")}

    def forget(self, name: str) -> None:
        """Keep `name` no more (see the module's comment)."""
        store = self.store
        assert isinstance(store, FileRows), "the source cannot keep files"
        if self.kept.get(name, None) != "":
            store.put_broker_file(name, "")
            self.kept[name] = ""
