"""Hypothesis against a live daemon's client port and broker port (bounded in examples and
time): the daemon never dies, bad frames get a protocol error and a closed connection,
requests with nonsense arguments get a clear error (never an internal one), other
sessions keep being served and memory stays bounded."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon import BrokerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_values import wire_values

from ssb import client
from ssb.client._recovery import CONTROL
from ssb.protocol import NEED_DATA, WIRE_VERSION, ErrorCode, FrameDecoder, Hello, encode_frame
from ssb.protocol._client_wire import REPLY_ERROR

pytestmark = pytest.mark.slow  # generated requests against a live daemon

HOST = "127.0.0.1"
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
OPERATIONS = [
    "create_queue",
    "alter_queue",
    "create_service",
    "create_contract",
    "create_message_type",
    "begin_dialog",
    "send",
    "end_conversation",
    "begin_conversation_timer",
    "move_conversation",
    "receive",
    "get_conversation_group",
    *sorted(CONTROL),
    "view",
    "drop",
    "grant",
    "revoke",
    "create_login",
    "alter_login",
    "drop_login",
    "requeue_dead_letter",
    "create_route",
    "create_broker_priority",
    "check_procedure",
    "log_task",
    "register_task",
    "request_stop",
    "attach_task",
    "ping",
    "no_such_operation",
]
values = wire_values(text=40, items=4, keys=8, leaves=12)
arguments = st.dictionaries(
    st.sampled_from(
        [
            "name",
            "queue",
            "handle",
            "handles",
            "timeout",
            "top",
            "kind",
            "status",
            "activation",
            "from_service",
            "to_service",
            "contract",
            "bodies",
            "message_type",
            "transaction_id",
            "permission",
            "login",
            "password",
            "limit",
            "after",
            "lifetime",
            "error",
            "x",
        ]
    ),
    values,
    max_size=5,
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    limits = {"login_timeout": 2.0, "hello_frame_size": 4096}
    process = BrokerProcess(
        Path(tmp_path_factory.mktemp("fuzz")) / "data", durability="os", config={"limits": limits}
    ).start()
    yield process
    process.kill()


def _frames(sock: socket.socket, want: int, timeout: float = 10.0) -> tuple[list[Any], bool]:
    """Up to `want` frames, and whether the broker closed the connection."""
    sock.settimeout(timeout)
    decoder = FrameDecoder()
    frames: list[Any] = []
    while len(frames) < want:
        chunk = sock.recv(65536)
        if not chunk:
            return frames, True
        decoder.receive_data(chunk)
        while (frame := decoder.next_frame()) is not NEED_DATA:
            frames.append(frame)
    return frames, False


def _logged_in(broker: BrokerProcess) -> socket.socket:
    sock = socket.create_connection((HOST, broker.client_port), timeout=10)
    hello = Hello(WIRE_VERSION, "admin", broker.admin_password()).encode()
    sock.sendall(encode_frame(hello))
    (welcome,), _ = _frames(sock, 1)
    assert not (isinstance(welcome, list) and welcome[1] == REPLY_ERROR), welcome
    return sock


def _still_serving(broker: BrokerProcess) -> None:
    assert broker.proc is not None and broker.proc.poll() is None, "the daemon died"
    with client.connect_sync(broker.url) as conn:
        assert conn.ping()


@FUZZ
@given(data=st.binary(min_size=1, max_size=2048))
def test_bytes_before_login_get_an_error_or_a_close(fuzzed: BrokerProcess, data: bytes) -> None:
    with socket.create_connection((HOST, fuzzed.client_port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # nothing more comes: the broker must decide
        frames, closed = _frames(sock, 2)
    assert closed
    for frame in frames:  # an error, or a welcome for a lucky valid hello
        assert isinstance(frame, list)


@FUZZ
@given(operation=st.sampled_from(OPERATIONS), args=arguments)
def test_nonsense_requests_get_a_clear_error_never_an_internal_one(
    fuzzed: BrokerProcess, operation: str, args: dict[str, Any]
) -> None:
    with _logged_in(fuzzed) as sock:
        try:
            sock.sendall(encode_frame([7, operation, args]) + encode_frame([8, "ping", {}]))
        except ValueError:
            return  # not encodable (e.g. an integer beyond msgpack's range): never sent
        frames, _ = _frames(sock, 2)
    answer = frames[0]
    assert answer[0] == 7
    if answer[1] == REPLY_ERROR:
        code, text = answer[2]
        assert code != ErrorCode.INTERNAL_ERROR, f"{operation}({args!r}): {text}"
    assert frames[1][0] == 8  # the session goes on after a refusal


@FUZZ
@given(depth=st.integers(1, 3000), width=st.integers(0, 3))
def test_deep_or_malformed_payloads_close_only_their_connection(
    fuzzed: BrokerProcess, depth: int, width: int
) -> None:
    # [7, "view", {"name": <depth nested lists>}] as raw msgpack, maybe with bad bytes after
    payload = b"\x93\x07\xa4view\x81\xa4name" + b"\x91" * depth + b"\xc0" + b"\xc1" * width
    with _logged_in(fuzzed) as sock:
        sock.sendall(struct.pack(">I", len(payload)) + payload + encode_frame([9, "ping", {}]))
        frames, closed = _frames(sock, 2)
    if 2 + depth > 32 or width:
        assert closed and len(frames) == 1 and frames[0][1] == REPLY_ERROR
        assert frames[0][2][0] == ErrorCode.MALFORMED_FRAME
    else:  # a request with a wrong argument: refused, and the session goes on
        assert [f[0] for f in frames] == [7, 9] and frames[0][1] == REPLY_ERROR
        assert frames[0][2][0] == ErrorCode.BAD_ARGUMENT


@FUZZ
@given(data=st.binary(min_size=1, max_size=4096))
def test_bytes_on_the_broker_port_never_hurt(fuzzed: BrokerProcess, data: bytes) -> None:
    assert fuzzed.broker_port
    with socket.create_connection((HOST, fuzzed.broker_port), timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(10)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # closed on us (reset, not connected): fine


def test_after_the_fuzzing_the_daemon_serves_and_memory_is_bounded(
    fuzzed: BrokerProcess,
) -> None:
    _still_serving(fuzzed)
    status = Path(f"/proc/{fuzzed.proc.pid}/status").read_text()  # type: ignore[union-attr]
    peak_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))
    assert peak_kb < 400 * 1024, f"the daemon peaked at {peak_kb} kB"
    assert "Traceback" not in fuzzed.log_text()
