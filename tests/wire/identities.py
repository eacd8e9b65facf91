"""The brokers the wire tests speak for: A and B, and M, an impostor that holds a
certificate of its own for B's id. Their RSA keys are slow to make: each is made once."""

from __future__ import annotations

import uuid

from ssb.protocol._integrity import generate_broker_identity, load_private_key

A_ID = uuid.UUID("aaaaaaaa-0000-4000-8000-000000000001")
B_ID = uuid.UUID("bbbbbbbb-0000-4000-8000-000000000002")
A_KEY_PEM, A_CERT = generate_broker_identity(A_ID)
B_KEY_PEM, B_CERT = generate_broker_identity(B_ID)
M_KEY_PEM, M_CERT = generate_broker_identity(B_ID)  # claims to be B
A_KEY, B_KEY, M_KEY = (load_private_key(pem) for pem in (A_KEY_PEM, B_KEY_PEM, M_KEY_PEM))
