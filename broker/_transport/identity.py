"""This broker's identity on the broker port: its key pair and certificate, and their rotation.

Theory of operation
-------------------
The identity is two files in the data directory, made on first start: the private key
(0600) and the self-signed certificate whose common name is the broker instance id. Peers
trust the certificate byte for byte, so replacing it is done in two steps that leave no
moment in which a peer cannot reach this broker:

1. `stage_next()` makes the next key pair and certificate (same instance id) beside the
   current ones and returns the certificate; operators add it on every peer
   (`create_certificate`), which then trusts old and new side by side.
2. `rotate()` makes the staged identity current. The old private key is kept (the newest
   `KEPT_PREVIOUS_KEYS` of them): a peer that wrapped a session key for the old
   certificate before it learned the new one still has that key unwrapped here, so no
   dialog is lost. Peers drop the old certificate once every link shows the new one.

`rotate()` moves files with `os.replace`, key first; `load()` finishes a rotation that a
crash interrupted between the two moves, so the key and certificate always match. The
store keeps a copy of these files (see `broker/_broker_files.py`): `changed` is told
after each change (a first start, a staged pair, a rotation), to save them there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.asymmetric import rsa

from ssb.protocol import generate_broker_identity, load_private_key

from .._logins import write_secret_file

KEY_FILE: Final = "broker-key.pem"
CERT_FILE: Final = "broker-cert.pem"
NEXT_KEY_FILE: Final = "broker-key.next.pem"
NEXT_CERT_FILE: Final = "broker-cert.next.pem"
PREVIOUS_KEY_PATTERN: Final = "broker-key.previous-*.pem"
_PREVIOUS_PREFIX, _, _PREVIOUS_SUFFIX = PREVIOUS_KEY_PATTERN.partition("*")
KEPT_PREVIOUS_KEYS: Final = 2
# every file of the identity, as fnmatch patterns
IDENTITY_PATTERNS: Final = (
    KEY_FILE,
    CERT_FILE,
    NEXT_KEY_FILE,
    NEXT_CERT_FILE,
    PREVIOUS_KEY_PATTERN,
)


@dataclass(frozen=True)
class Identity:
    """The current identity and the private keys of the previous ones, newest first."""

    certificate_pem: bytes
    private_key: rsa.RSAPrivateKey
    previous_keys: tuple[rsa.RSAPrivateKey, ...]

    @property
    def private_keys(self) -> tuple[rsa.RSAPrivateKey, ...]:
        """Every key a session key may have been wrapped for, current first."""
        return (self.private_key, *self.previous_keys)


class IdentityFiles:
    """The identity files of one data directory."""

    def __init__(
        self, data_dir: Path, instance_id: str, changed: Callable[[], None] = lambda: None
    ) -> None:
        self.data_dir = data_dir
        self.instance = uuid.UUID(instance_id)
        self.changed = changed
        self.key_path = data_dir / KEY_FILE
        self.cert_path = data_dir / CERT_FILE
        self._next_key = data_dir / NEXT_KEY_FILE
        self._next_cert = data_dir / NEXT_CERT_FILE

    def load(self) -> Identity:
        """The identity on disk, made on first start."""
        if self._next_cert.exists() and not self._next_key.exists():
            os.replace(self._next_cert, self.cert_path)  # a rotation stopped half-way
        if not (self.key_path.exists() and self.cert_path.exists()):
            key_pem, cert_pem = generate_broker_identity(self.instance)
            write_secret_file(self.key_path, key_pem.decode("ascii"))
            self.cert_path.write_bytes(cert_pem)
            self.changed()
        previous = [load_private_key(p.read_bytes()) for p in self._previous_paths()]
        return Identity(
            self.cert_path.read_bytes(),
            load_private_key(self.key_path.read_bytes()),
            tuple(previous),
        )

    def stage_next(self) -> bytes:
        """The staged next certificate, made if there is none yet."""
        if not self.has_next():
            key_pem, cert_pem = generate_broker_identity(self.instance)
            write_secret_file(self._next_key, key_pem.decode("ascii"))
            self._next_cert.write_bytes(cert_pem)
            self.changed()
        return self._next_cert.read_bytes()

    def has_next(self) -> bool:
        return self._next_key.exists() and self._next_cert.exists()

    def rotate(self) -> Identity:
        """Make the staged identity current, keeping the old private key.

        Raises: FileNotFoundError: nothing is staged.
        """
        if not self.has_next():
            raise FileNotFoundError("no next certificate is staged")
        paths = self._previous_paths()
        number = 1 + max((self._number(p) for p in paths), default=0)
        kept = self.data_dir / f"{_PREVIOUS_PREFIX}{number}{_PREVIOUS_SUFFIX}"
        write_secret_file(kept, self.key_path.read_text(encoding="ascii"))
        os.replace(self._next_key, self.key_path)
        os.replace(self._next_cert, self.cert_path)
        for old in self._previous_paths()[KEPT_PREVIOUS_KEYS:]:
            old.unlink(missing_ok=True)
        self.changed()
        return self.load()

    def _previous_paths(self) -> list[Path]:
        """Kept previous keys, newest first."""
        found = [p for p in self.data_dir.glob(PREVIOUS_KEY_PATTERN) if self._number(p) > 0]
        return sorted(found, key=self._number, reverse=True)

    @staticmethod
    def _number(path: Path) -> int:
        text = path.name.removeprefix(_PREVIOUS_PREFIX).removesuffix(_PREVIOUS_SUFFIX)
        return int(text) if text.isdigit() else 0
