"""The broker identity files: staging, rotating, keeping previous keys, and finishing a
rotation that a crash interrupted."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ssb.broker._transport.identity import KEPT_PREVIOUS_KEYS, IdentityFiles
from ssb.protocol import certificate_broker_id
from ssb.protocol._integrity import certificate_public_key


def _der(public_key: rsa.RSAPublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _public(key: rsa.RSAPrivateKey) -> bytes:
    return _der(key.public_key())


def test_rotations_keep_the_newest_previous_keys_and_the_instance_id(tmp_path: Path) -> None:
    instance = uuid.uuid4()
    files = IdentityFiles(tmp_path, str(instance))
    first = files.load()
    assert files.stage_next() == files.stage_next()  # made once
    keys = [first.private_key]
    for _ in range(KEPT_PREVIOUS_KEYS + 1):
        staged = files.stage_next()
        current = files.rotate()
        assert current.certificate_pem == staged
        assert certificate_broker_id(current.certificate_pem) == instance
        keys.append(current.private_key)
    previous = [_public(k) for k in current.previous_keys]
    assert previous == [_public(k) for k in reversed(keys[-1 - KEPT_PREVIOUS_KEYS : -1])]
    assert len(list(tmp_path.glob("broker-key.previous-*.pem"))) == KEPT_PREVIOUS_KEYS
    assert oct(os.stat(next(tmp_path.glob("broker-key.previous-*.pem"))).st_mode & 0o777) == "0o600"
    assert _public(files.load().private_key) == _public(current.private_key)


def test_a_rotation_stopped_between_its_two_moves_is_finished_at_load(tmp_path: Path) -> None:
    files = IdentityFiles(tmp_path, str(uuid.uuid4()))
    files.load()
    staged = files.stage_next()
    os.replace(tmp_path / "broker-key.next.pem", files.key_path)  # the crash: key moved only
    loaded = files.load()
    assert loaded.certificate_pem == staged
    assert _der(loaded.private_key.public_key()) == _der(certificate_public_key(staged))
