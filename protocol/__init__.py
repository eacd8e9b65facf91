"""Pure (sans-IO) protocol code shared by the broker and the client.

Nothing in this package performs I/O or reads a clock: bytes and time come in as
arguments, events and bytes go out. Everything another package uses is exported
here; the private modules are this package's own business.
"""

from __future__ import annotations

from ._client_wire import (
    MESSAGE_COLUMNS,
    WIRE_VERSION,
    Hello,
    Reply,
    Request,
    Welcome,
    encode_error,
    encode_ok,
)
from ._dialog import DialogPeer, RetryPolicy
from ._dialog_events import (
    DialogEvent,
    FragmentReceived,
    HeldFragment,
    IntegrityFailure,
    MessageAcked,
    MessageReceived,
    PartialMessage,
    PartialMessageDiscarded,
    PendingMessage,
    SessionKeyReceived,
    UnknownDialog,
)
from ._dialog_frames import (
    AckFrame,
    BundleFrame,
    Direction,
    Envelope,
    FragmentFrame,
)
from ._errors import (
    ErrorCode,
    IntegrityError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from ._framing import (
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_HEADROOM,
    MAX_FRAME_SIZE,
    MAX_MESSAGE_SIZE_LIMIT,
    NEED_DATA,
    ROW_OVERHEAD,
    FrameDecoder,
    encode_frame,
    pack,
    unpack,
)
from ._integrity import (
    TrustStore,
    certificate_broker_id,
    generate_broker_identity,
    load_private_key,
    new_session_key,
    sign_origin,
    verify_origin,
    wrap_session_key,
)
from ._link import (
    CloseFrame,
    ConnectionClosed,
    HandshakeCompleted,
    LinkConnection,
    LinkState,
    ProtocolErrorFrame,
    Role,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FRAME_HEADROOM",
    "MAX_FRAME_SIZE",
    "MAX_MESSAGE_SIZE_LIMIT",
    "MESSAGE_COLUMNS",
    "NEED_DATA",
    "ROW_OVERHEAD",
    "WIRE_VERSION",
    "AckFrame",
    "BundleFrame",
    "CloseFrame",
    "ConnectionClosed",
    "DialogEvent",
    "DialogPeer",
    "Direction",
    "Envelope",
    "ErrorCode",
    "FragmentFrame",
    "FragmentReceived",
    "FrameDecoder",
    "HandshakeCompleted",
    "HeldFragment",
    "Hello",
    "IntegrityError",
    "IntegrityFailure",
    "LinkConnection",
    "LinkState",
    "LocalProtocolError",
    "MessageAcked",
    "MessageReceived",
    "PartialMessage",
    "PartialMessageDiscarded",
    "PendingMessage",
    "ProtocolError",
    "ProtocolErrorFrame",
    "RemoteProtocolError",
    "Reply",
    "Request",
    "RetryPolicy",
    "Role",
    "SessionKeyReceived",
    "TrustStore",
    "UnknownDialog",
    "Welcome",
    "certificate_broker_id",
    "encode_error",
    "encode_frame",
    "encode_ok",
    "generate_broker_identity",
    "load_private_key",
    "new_session_key",
    "pack",
    "sign_origin",
    "unpack",
    "verify_origin",
    "wrap_session_key",
]
