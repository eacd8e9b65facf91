"""Integrity: sealed MD5 signatures, session-key wrapping, identities and handshake proofs."""

from __future__ import annotations

import hashlib
import random
import uuid

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from identities import A_CERT, A_ID, A_KEY, A_KEY_PEM, B_CERT, B_ID, B_KEY, M_CERT, M_KEY

from ssb.protocol import (
    ErrorCode,
    IntegrityError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from ssb.protocol._integrity import (
    NONCE_SIZE,
    SESSION_KEY_SIZE,
    SIGNATURE_SIZE,
    SessionSeal,
    TrustStore,
    certificate_broker_id,
    certificate_public_key,
    generate_broker_identity,
    load_certificate,
    load_private_key,
    new_nonce,
    new_session_key,
    seal_signature,
    sign_handshake_proof,
    unwrap_session_key,
    verify_handshake_proof,
    verify_signature,
    wrap_session_key,
)

KEY = bytes(range(16))


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8 % len(out)] ^= 1 << (bit % 8)
    return bytes(out)


# --------------------------------------------------------------------------- signatures


def test_signature_is_md5_sealed_with_the_session_key() -> None:
    content = b"header|payload"
    digest = hashlib.md5(content).digest()
    encryptor = Cipher(algorithms.AES(KEY), modes.ECB()).encryptor()
    expected = encryptor.update(digest) + encryptor.finalize()
    assert seal_signature(KEY, content) == expected
    assert len(expected) == SIGNATURE_SIZE
    assert SessionSeal(KEY).sign(b"header|", b"payload") == expected


def test_sealed_signature_verifies() -> None:
    seal = SessionSeal(KEY)
    signature = seal.sign(b"header", b"payload")
    seal.verify(signature, b"header", b"payload")
    verify_signature(KEY, b"headerpayload", signature)
    # the encryptor is reused: a second signature is just as right
    assert seal.sign(b"header", b"payload") == signature


@given(bit=st.integers(0, 8 * 13 - 1))
def test_flipped_bit_in_content_fails(bit: int) -> None:
    content = b"some content!"
    signature = seal_signature(KEY, content)
    with pytest.raises(IntegrityError) as caught:
        verify_signature(KEY, flip(content, bit), signature)
    assert caught.value.code is ErrorCode.INTEGRITY_CHECK_FAILED


@given(bit=st.integers(0, 8 * SIGNATURE_SIZE - 1))
def test_flipped_bit_in_signature_fails(bit: int) -> None:
    signature = seal_signature(KEY, b"content")
    with pytest.raises(IntegrityError):
        verify_signature(KEY, b"content", flip(signature, bit))


def test_other_session_key_fails() -> None:
    signature = seal_signature(KEY, b"content")
    with pytest.raises(IntegrityError):
        verify_signature(bytes(16), b"content", signature)


def test_session_key_must_be_16_bytes() -> None:
    with pytest.raises(LocalProtocolError):
        SessionSeal(bytes(15))
    with pytest.raises(LocalProtocolError):
        wrap_session_key(bytes(17), B_CERT)


def test_random_sources_are_injectable() -> None:
    rng = random.Random(7)
    assert new_session_key(rng.randbytes) == random.Random(7).randbytes(SESSION_KEY_SIZE)
    assert len(new_session_key()) == SESSION_KEY_SIZE
    assert len(new_nonce()) == NONCE_SIZE
    assert new_session_key() != new_session_key()
    with pytest.raises(LocalProtocolError):
        new_nonce(lambda n: b"short")


# --------------------------------------------------------------------------- session keys


def test_key_wrap_roundtrip_with_generated_identity() -> None:
    session_key = new_session_key()
    wrapped = wrap_session_key(session_key, B_CERT)
    assert session_key not in wrapped
    assert unwrap_session_key(wrapped, B_KEY) == session_key
    by_key = wrap_session_key(session_key, certificate_public_key(B_CERT))
    assert unwrap_session_key(by_key, B_KEY) == session_key
    assert by_key != wrapped  # OAEP is randomised


def test_key_wrapped_for_someone_else_does_not_unwrap() -> None:
    wrapped = wrap_session_key(new_session_key(), B_CERT)
    with pytest.raises(IntegrityError):
        unwrap_session_key(wrapped, A_KEY)
    with pytest.raises(IntegrityError):
        unwrap_session_key(flip(wrapped, 100), B_KEY)
    with pytest.raises(IntegrityError):
        unwrap_session_key(b"", B_KEY)
    with pytest.raises(IntegrityError):
        unwrap_session_key(bytes(5000), B_KEY)


@settings(max_examples=30)
@given(blob=st.binary(max_size=600))
def test_unwrap_of_garbage_only_raises_integrity_error(blob: bytes) -> None:
    with pytest.raises(IntegrityError):
        unwrap_session_key(blob, B_KEY)


# --------------------------------------------------------------------------- identities


def test_generated_identity_names_the_broker() -> None:
    assert A_KEY_PEM.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert A_CERT.startswith(b"-----BEGIN CERTIFICATE-----")
    assert certificate_broker_id(A_CERT) == A_ID
    assert certificate_broker_id(B_CERT) == B_ID
    certificate = load_certificate(A_CERT)
    assert certificate.issuer == certificate.subject
    assert certificate_public_key(A_CERT).public_numbers() == A_KEY.public_key().public_numbers()


def test_identity_key_size_is_bounded() -> None:
    with pytest.raises(LocalProtocolError):
        generate_broker_identity(A_ID, key_size=1024)


def test_loaders_reject_garbage() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        load_certificate(b"not a certificate")
    assert caught.value.code is ErrorCode.HANDSHAKE_FAILED
    with pytest.raises(RemoteProtocolError):
        load_certificate(b"x" * 100_000)
    with pytest.raises(LocalProtocolError):
        load_private_key(b"not a key")
    with pytest.raises(RemoteProtocolError):
        certificate_broker_id(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")


@settings(max_examples=50)
@given(blob=st.binary(max_size=300))
def test_certificate_parsing_of_garbage_only_raises_protocol_errors(blob: bytes) -> None:
    with pytest.raises(ProtocolError):
        load_certificate(b"-----BEGIN CERTIFICATE-----\n" + blob + b"\n-----END CERTIFICATE-----\n")


def test_trust_store_compares_exact_certificates() -> None:
    store = TrustStore([A_CERT, B_CERT])
    assert len(store) == 2
    assert store.is_trusted(load_certificate(B_CERT))
    assert not store.is_trusted(load_certificate(M_CERT))  # same name, other key


# --------------------------------------------------------------------------- handshake proof


def _proof_as_b(
    key: rsa.RSAPrivateKey, certificate: bytes, trusted: TrustStore | None = None
) -> x509.Certificate:
    """A handshake proof signed with `key` as B's to A, verified as made with
    `certificate` against `trusted` (by default B's certificate alone)."""
    nonce = new_nonce()
    proof = sign_handshake_proof(key, signer_id=B_ID, peer_id=A_ID, peer_nonce=nonce)
    return verify_handshake_proof(
        certificate_pem=certificate,
        proof=proof,
        signer_id=B_ID,
        peer_id=A_ID,
        peer_nonce=nonce,
        trusted=[B_CERT] if trusted is None else trusted,
    )


def test_handshake_proof_verifies_with_trusted_certificate() -> None:
    certificate = _proof_as_b(B_KEY, B_CERT)
    assert certificate_broker_id(B_CERT) == B_ID
    assert certificate.subject == load_certificate(B_CERT).subject


def test_handshake_proof_verifies_with_a_trust_store() -> None:
    _proof_as_b(B_KEY, B_CERT, trusted=TrustStore([A_CERT, B_CERT]))


def test_handshake_proof_fails_with_untrusted_certificate() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        _proof_as_b(M_KEY, M_CERT)
    assert caught.value.code is ErrorCode.HANDSHAKE_FAILED
    assert "not trusted" in str(caught.value)


def test_handshake_proof_with_a_stolen_certificate_fails() -> None:
    with pytest.raises(RemoteProtocolError, match="does not verify"):
        _proof_as_b(M_KEY, B_CERT)


@pytest.mark.parametrize("what", ["nonce", "signer", "peer", "proof"])
def test_handshake_proof_is_bound_to_nonce_and_both_ids(what: str) -> None:
    nonce = new_nonce()
    proof = sign_handshake_proof(B_KEY, signer_id=B_ID, peer_id=A_ID, peer_nonce=nonce)
    args = {"proof": proof, "signer_id": B_ID, "peer_id": A_ID, "peer_nonce": nonce}
    if what == "nonce":
        args["peer_nonce"] = new_nonce()
    elif what == "signer":
        args["signer_id"] = uuid.uuid4()  # the certificate names B, not this id
    elif what == "peer":
        args["peer_id"] = uuid.uuid4()
    else:
        args["proof"] = flip(proof, 9)
    with pytest.raises(RemoteProtocolError) as caught:
        verify_handshake_proof(certificate_pem=B_CERT, trusted=[B_CERT], **args)  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.HANDSHAKE_FAILED


@settings(max_examples=30)
@given(proof=st.binary(max_size=1100))
def test_handshake_proof_of_garbage_only_raises_protocol_errors(proof: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        verify_handshake_proof(
            certificate_pem=B_CERT,
            proof=proof,
            signer_id=B_ID,
            peer_id=A_ID,
            peer_nonce=bytes(32),
            trusted=[B_CERT],
        )


def test_a_location_proof_verifies_only_for_its_own_question() -> None:
    from ssb.protocol import sign_location, verify_location, verify_origin

    host, origin = uuid.uuid4(), uuid.uuid4()
    key_pem, cert = generate_broker_identity(host)
    proof = sign_location(load_private_key(key_pem), bytes(16), "Orders", host, origin)
    verify_location(cert, bytes(16), "Orders", host, origin, proof)
    for token, service, broker, asker in (
        (bytes([1]) * 16, "Orders", host, origin),  # another question
        (bytes(16), "Order", host, origin),  # another service
        (bytes(16), "Orders", origin, origin),  # another broker claiming it
        (bytes(16), "Orders", host, host),  # asked by another broker
    ):
        with pytest.raises(IntegrityError):
            verify_location(cert, token, service, broker, asker, proof)
    _, other = generate_broker_identity(host)  # an impostor's certificate for the same id
    with pytest.raises(IntegrityError):
        verify_location(other, bytes(16), "Orders", host, origin, proof)
    with pytest.raises(IntegrityError):  # never taken for an origin proof either
        verify_origin(cert, bytes(16), proof)
