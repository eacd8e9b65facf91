"""Locating a service: which broker hosts it, asked along the routes and proved by its host.

Theory of operation. A route need not name the broker instance of its service (Service
Broker's own rule); a dialog, sealed end to end, still needs its far broker before its
first message. So a broker asks its adjacent broker (`LocateFrame`: a random token, the
service, the asking broker), which answers or passes the question on along its own route
(`hops`, at most MAX_LOCATE_HOPS); the answer (`LocatedFrame`) names the broker that
hosts the service with its signature over the question (see `_integrity.sign_location`),
or none and says why, in words. Both travel on established links of protocol version
LOCATE_VERSION and up (`_link`); the broker decides what to do with them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from ._fields import (
    MAX_ERROR_TEXT,
    FrameKind,
    bytes_field,
    frame_fields,
    int_field,
    malformed,
    str_field,
    uuid_field,
)
from ._integrity import MAX_PROOF_SIZE

LOCATE_VERSION: Final = 3  # the protocol version that speaks these frames
MAX_LOCATE_HOPS: Final = 8  # brokers a service lookup passes at most
LOCATE_TOKEN_SIZE: Final = 16


@dataclass(frozen=True, slots=True)
class LocateFrame:
    """Which broker hosts `service`? Asked by broker `origin` (routed by service name,
    `hops` brokers so far); `token` names the question in its answer."""

    token: bytes
    service: str
    origin: uuid.UUID
    hops: int = 0

    def encode(self) -> list[object]:
        """Wire form."""
        return [FrameKind.LOCATE, self.token, self.service, self.origin, self.hops]

    @classmethod
    def decode(cls, obj: list[Any]) -> LocateFrame:
        """Raises: RemoteProtocolError: malformed."""
        f = frame_fields(obj, FrameKind.LOCATE, 4)
        return cls(
            bytes_field(f[1], "locate token", LOCATE_TOKEN_SIZE, LOCATE_TOKEN_SIZE),
            str_field(f[2], "service"),
            uuid_field(f[3], "origin broker id"),
            int_field(f[4], "hops", 0, MAX_LOCATE_HOPS),
        )


@dataclass(frozen=True, slots=True)
class LocatedFrame:
    """The answer to the LocateFrame `token`: broker `broker_id` hosts `service` and
    proves it (`proof`: its signature, see `_integrity.sign_location`), or none was
    found (`broker_id` None) and `reason` says why, in words."""

    token: bytes
    service: str
    broker_id: uuid.UUID | None
    proof: bytes | None = None
    reason: str = ""

    def encode(self) -> list[object]:
        """Wire form."""
        return [
            FrameKind.LOCATED,
            self.token,
            self.service,
            self.broker_id,
            self.proof,
            self.reason,
        ]

    @classmethod
    def decode(cls, obj: list[Any]) -> LocatedFrame:
        """Raises: RemoteProtocolError: malformed (found without a proof, or neither)."""
        f = frame_fields(obj, FrameKind.LOCATED, 5)
        broker = None if f[3] is None else uuid_field(f[3], "located broker id")
        proof = None if f[4] is None else bytes_field(f[4], "location proof", MAX_PROOF_SIZE)
        if (broker is None) != (proof is None):
            raise malformed("a located broker comes with its proof, and only then")
        return cls(
            bytes_field(f[1], "locate token", LOCATE_TOKEN_SIZE, LOCATE_TOKEN_SIZE),
            str_field(f[2], "service"),
            broker,
            proof,
            str_field(f[5], "reason", MAX_ERROR_TEXT),
        )
