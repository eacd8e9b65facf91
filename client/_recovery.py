"""What a client knows about its session's transaction, and how a lost answer is settled.

Theory of operation. Both clients (async and blocking) run every request through one
`Tracker` and every reconnect through one `Redial`; neither does I/O, and the monotonic
times they compare are passed in (only a UUIDv7's stamp reads the wall clock), so the
rules live in one place and the clients only move bytes, sleep and reconnect.

Naming. Before a request leaves, `prepare` names it: BEGIN TRANSACTION gets a fresh
`txn_id`, a statement outside a transaction that changes something gets a fresh `txn`
(a one-statement transaction), observations (views, ping) and statements inside a
transaction get nothing. Ids are UUIDv7: time-ordered, so the broker's record of them
grows at its end.

Settling. When the connection drops, every request whose answer had not arrived is
settled once the client has reconnected, by `settle`: a generator that yields the
requests to make (an outcome question, a re-send) and receives each answer, and
finally returns the request's result or raises its error:

- an observation, or a statement that was never applied, is sent again (with a new
  name: the old one is fenced by the broker's answer);
- a named statement or a COMMIT asks `transaction_outcome`; "committed" is success
  (a statement that returns a value whose answer is lost raises `AnswerLostError`),
  "rolled_back" re-sends a statement or raises `TransactionRolledBackError` for a
  commit, "unknown" raises `OutcomeUnknownError`;
- a statement inside an open transaction raises `TransactionRolledBackError` (the
  broker rolled the transaction back when the connection dropped), and so does every
  later statement of that transaction until the application rolls it back;
- a detached transaction survives: its in-flight statements raise `ConnectionLostError`
  (`transaction_messages` tells what it received), and it is attached again.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final

from ssb.protocol import Welcome

from . import _calls as calls
from ._errors import (
    AnswerLostError,
    BrokerError,
    ConnectionLostError,
    LockTimeoutError,
    OutcomeUnknownError,
    ProtocolViolationError,
    TransactionRolledBackError,
)
from ._url import Target, parse_url

log = logging.getLogger("ssb.client")

# requests that change nothing in the store: a lost one is simply asked again (a USE
# asked again puts the session where it was)
OBSERVATIONS: Final = frozenset(
    {
        "use",
        "view",
        "peek",
        "ping",
        "broker_instance",
        "broker_certificate",
        "transaction_messages",
        "transaction_outcome",
    }
)
# requests about the session's transaction: never named as statements
CONTROL: Final = frozenset(
    {
        "begin_transaction",
        "commit",
        "rollback",
        "detach_transaction",
        "attach_transaction",
        "commit_transaction",
        "rollback_transaction",
    }
)

# requests whose answers `Tracker.answered` notes
_ANSWER_NOTED: Final = frozenset(
    {"begin_transaction", "detach_transaction", "attach_transaction", "use"}
)
# requests that wait up to a `timeout` (seconds) for messages
WAITS: Final = frozenset({"receive", "get_conversation_group"})
Settling = Generator["Sent", Any, Any]
CLOCK_ALLOWANCE: Final = 60.0  # seconds by which two machines' clocks may differ
DEFAULT_RETRIES: Final = 10
# what run_transaction runs again: errors after which the transaction surely rolled back
RETRIED: Final = (TransactionRolledBackError, LockTimeoutError)
RECONNECT_DEADLINE: Final = 60.0
RECONNECT_FIRST_DELAY: Final = 0.05
RECONNECT_MAX_DELAY: Final = 2.0


@dataclass(frozen=True, slots=True)
class Options:
    """How a connection behaves when it drops."""

    timeout: float
    reconnect: bool
    reconnect_deadline: float


class Retries:
    """`run_transaction`'s policy: run the transaction again only after an error that
    surely rolled it back (`RETRIED`), at most `retries` more times."""

    def __init__(self, retries: object) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, not {retries!r}")
        self.retries = retries
        self.attempt = 0

    def again(self, failure: BaseException) -> bool:
        """Whether to run the transaction again after `failure` (logged when so)."""
        if not isinstance(failure, RETRIED) or self.attempt >= self.retries:
            return False
        self.attempt += 1
        log.info(
            "transaction rolled back (%s); running it again (%d of %d)",
            failure,
            self.attempt,
            self.retries,
        )
        return True


class Redial:
    """One reconnect: when to try again, and whether what answered may be used."""

    def __init__(self, url: str, options: Options, reason: str, now: float) -> None:
        self.target = parse_url(url)
        self.options = options
        self.started = now
        self.delay = RECONNECT_FIRST_DELAY
        log.info("connection to %s lost (%s); reconnecting", self.target.where, reason)

    def pause(self, failure: ConnectionLostError, now: float) -> float:
        """Seconds to wait before the next try after `failure`; raises past the deadline."""
        delay = self.delay
        if now + delay > self.started + self.options.reconnect_deadline:
            raise ConnectionLostError(
                f"could not reconnect to the broker at {self.target.where}"
                f" within {self.options.reconnect_deadline:g} s (reconnect_deadline): {failure}"
            ) from failure
        self.delay = min(delay * 2, RECONNECT_MAX_DELAY)
        return delay

    def accept(self, instance: str, expected: str, now: float) -> None:
        """The broker that answered is `instance`; only the one before may settle."""
        if instance != expected:
            raise ConnectionLostError(
                f"reconnected to a different broker (instance {instance}, not {expected}):"
                " what was in flight cannot be settled there"
            )
        log.info("reconnected to %s after %.2f s", self.target.where, now - self.started)


def none_answered(target: Target, failures: list[ConnectionLostError]) -> ConnectionLostError:
    """The error of a URL none of whose addresses let the client in: each one's failure."""
    if len(failures) == 1:
        return failures[0]
    text = "; ".join(str(f) for f in failures)
    error = ConnectionLostError(f"none of the broker's addresses answered ({text})")
    error.__cause__ = failures[-1].__cause__
    return error


def opened_database(welcome: Welcome, wanted: str) -> str:
    """The database the broker opened the session in (`wanted`: the one asked for, ""
    for the broker's default). Raises when the broker knows no databases."""
    if wanted and not welcome.database:
        raise ProtocolViolationError(
            f"the broker ({welcome.server}) does not know databases, so it cannot open"
            f" '{wanted}': it is older than this client; connect without database="
        )
    return welcome.database


MAX_CONNECT_TIMEOUT: Final = 3600.0


def check_connect_timeout(value: object) -> float:
    """A connect timeout from a caller: a finite number of seconds, above 0, at most an
    hour (both clients refuse the same values the same way)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value <= MAX_CONNECT_TIMEOUT  # (NaN fails too)
    ):
        raise ValueError(
            f"timeout must be seconds above 0, at most {MAX_CONNECT_TIMEOUT:g}, not {value!r}"
        )
    return float(value)


def check_deadline(value: object) -> float:
    """A reconnect deadline from a caller: a finite number of seconds, 0..1 day."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= 86400
    ):
        raise ValueError(f"reconnect_deadline must be seconds from 0 to 86400, not {value!r}")
    return float(value)


def unsettled_text(sent: Sent, exc: BaseException) -> str:
    """What a caller is told when a lost request could not be settled for want of a broker."""
    txn = sent.txn
    if sent.call.operation == "commit" and txn is not None and txn.id is not None:
        return (
            f"{exc}; whether transaction {txn.id} committed is not known yet: ask"
            f" transaction_outcome('{txn.id}') once the broker is reachable"
        )
    if sent.name is not None:
        return (
            f"{exc}; whether {sent.call.operation} (statement {sent.name}) was applied is not"
            f" known yet: ask transaction_outcome('{sent.name}') once the broker is reachable"
        )
    return str(exc)


# The random bits of the ids: a generator of this module's own (so that no program's
# random.seed() can make two clients' ids alike), seeded from os.urandom, and again in a
# forked child; drawing from it costs no system call, as os.urandom does on each id.
_random = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_random.seed)


def uuid7(now: float | None = None) -> uuid.UUID:
    """A time-ordered random UUID (RFC 9562 version 7): 48 bits of milliseconds first."""
    millis = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    rand = _random.getrandbits(74)
    value = (millis << 80) | (0x7 << 76) | (rand >> 62) << 64
    value |= (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)


@dataclass(slots=True, eq=False)
class Txn:
    """The session's explicit transaction, as the client knows it."""

    id: uuid.UUID | None  # None: a detached transaction whose BEGIN has not answered yet
    detached: bool = False
    broken: str | None = None  # why it can only be rolled back now
    statements: int = 0  # sent in it after its BEGIN
    ended: str = ""  # the operation that ended it, once sent: commit, rollback, detach
    outcome: tuple[str, str] | None = None  # its commit's outcome, once asked


@dataclass(slots=True, eq=False)
class Sent:
    """One request as it left: what it was, its name, its transaction, when."""

    call: calls.Call[Any]
    name: uuid.UUID | None
    txn: Txn | None
    at: float


class Tracker:
    """The session's transaction, and the rules for requests whose answers were lost."""

    def __init__(self, database: str = "") -> None:
        self.txn: Txn | None = None
        self.database = database  # the session's database: a reconnect opens it again
        # recent commits/statements -> when (keyed by the UUID's number: hashing a UUID
        # calls its Python __hash__, an int hashes in C)
        self.sent_times: dict[int, float] = {}
        # "operation outcome" -> how many lost answers were settled so (for logs and tests)
        self.settled: Counter[str] = Counter()

    # ---- before and after a request ---------------------------------------------------------

    def prepare(self, call: calls.Call[Any], now: float) -> Sent | None:
        """Name `call` and note what it does to the transaction. None: answered here (the
        rollback of a transaction the broker already rolled back). Raises instead of
        sending a statement of a transaction known to be rolled back."""
        op = call.operation
        txn = self.txn
        if (
            txn is not None
            and txn.broken is not None
            and op != "begin_transaction"
            and op not in OBSERVATIONS
        ):
            self.txn = None if op in ("commit", "rollback") else txn
            if op == "rollback":
                return None
            raise TransactionRolledBackError(txn.broken)
        name: uuid.UUID | None = None
        if op == "begin_transaction":
            if call.arguments.get("detached"):
                txn = Txn(None, detached=True)
            elif "txn_id" in call.arguments:
                txn = Txn(call.arguments["txn_id"])
            else:
                txn = Txn(uuid7())
                call = calls.Call(op, {**call.arguments, "txn_id": txn.id}, call.decode)
            self.txn = txn
        elif op in ("commit", "rollback", "detach_transaction"):
            self.txn = None  # what follows runs outside it (a failed COMMIT rolled back)
            if txn is not None:
                txn.ended = op
            if op == "commit" and txn is not None and txn.id is not None:
                self._remember(txn.id, now)
        elif txn is not None:
            txn.statements += 1
        elif op not in OBSERVATIONS and op not in CONTROL:
            name = uuid7()
            call = calls.Call(op, {**call.arguments, "txn": name}, call.decode)
            self._remember(name, now)
        return Sent(call, name, txn, now)

    def answered(self, sent: Sent, ok: bool, result: Any) -> None:
        """The broker answered `sent` (`result`: the decoded value when `ok`)."""
        op = sent.call.operation
        if op not in _ANSWER_NOTED:
            return
        if op == "begin_transaction":
            if not ok and self.txn is sent.txn:
                self.txn = None
            elif ok and sent.txn is not None and sent.txn.detached:
                sent.txn.id = result
        elif op == "detach_transaction" and not ok and self.txn is None:
            self.txn = sent.txn  # it stays this connection's transaction
        elif op == "attach_transaction" and ok:
            self.txn = Txn(sent.call.arguments["transaction_id"], detached=True)
        elif op == "use" and ok:
            self.database = result

    def _remember(self, name: uuid.UUID, now: float) -> None:
        times = self.sent_times
        times[name.int] = now
        if len(times) > 4096:
            for key in list(times)[:1024]:
                del times[key]

    def age(self, txn_id: uuid.UUID, now: float) -> float | None:
        """At most how many seconds ago `txn_id`'s commit left, if this client can tell."""
        sent = self.sent_times.get(txn_id.int)
        if sent is not None:
            return max(0.0, now - sent)
        if txn_id.version == 7:  # its own clock stamp, with room for clocks that differ
            return max(0.0, time.time() - (txn_id.int >> 80) / 1000) + CLOCK_ALLOWANCE
        return None

    # ---- the connection dropped ---------------------------------------------------------------

    def lost(self, reason: str, pending: list[Sent]) -> None:
        """The connection dropped with `pending` unanswered (in the order they left)."""
        txn = self.txn
        if txn is None or txn.detached or txn.broken is not None:
            return
        if txn.statements == 0 and any(
            s.txn is txn and s.call.operation == "begin_transaction" for s in pending
        ):
            self.txn = None  # only its BEGIN was under way: it is simply begun again
            return
        txn.broken = (
            f"the connection to the broker was lost ({reason}) while transaction {txn.id} was"
            " open; the broker rolled it back and applied none of it"
        )

    def settle(self, sent: Sent, now: float) -> Settling:
        """Settle one request whose answer was lost; see the module's rules."""
        op = sent.call.operation
        txn = sent.txn
        if op in OBSERVATIONS or op == "attach_transaction":
            return (yield sent)
        if op == "begin_transaction" and txn is not None and not (txn.statements or txn.ended):
            return (yield from self._again(sent, now))  # nothing else of it left: begin again
        if txn is not None and not txn.detached and txn.ended == "commit" and txn.id is not None:
            # its commit left too: each of its requests shares the commit's outcome
            outcome, why = yield from self._commit_outcome(txn, now - sent.at, now)
            if outcome != "committed":
                raise _unsettled(outcome, why, f"commit of transaction {txn.id}")
            if op in ("commit", "begin_transaction") or sent.call.decode is calls.NO_RESULT:
                return None
            raise AnswerLostError(
                f"transaction {txn.id} committed, but the answer to its {op} was lost with the"
                " connection; wait for each answer before the commit (run_transaction does)"
            )
        if op == "commit" and txn is not None and txn.detached and txn.id is not None:
            return (yield from self._settle_detached_commit(txn, now - sent.at, now))
        if op in ("commit_transaction", "rollback_transaction"):
            ident = sent.call.arguments["transaction_id"]
            outcome, why = yield _ask(calls.transaction_outcome(ident, now - sent.at), now)
            self.settled[f"{op} {outcome}"] += 1
            if outcome == "open":
                return (yield sent)
            if op == "rollback_transaction" or outcome == "committed":
                return None
            raise _unsettled(outcome, why, f"commit of detached transaction {ident}")
        if op == "rollback":
            return None  # a dropped connection rolls back (a detached one: see reattach)
        if op == "detach_transaction":
            return txn.id if txn is not None else None
        if txn is not None:
            if txn.detached:
                raise ConnectionLostError(
                    f"the connection to the broker was lost during {op} in detached transaction"
                    f" {txn.id}; it stays open, and transaction_messages() shows what it received"
                )
            raise TransactionRolledBackError(txn.broken or f"transaction {txn.id} was rolled back")
        if sent.name is None:
            return (yield sent)
        outcome, why = yield _ask(calls.transaction_outcome(sent.name, now - sent.at), now)
        self.settled[f"{op} {outcome}"] += 1
        if outcome == "committed":
            if sent.call.decode is calls.NO_RESULT:
                return None
            raise AnswerLostError(
                f"{op} was applied (as statement {sent.name}) but its answer was lost with the"
                " connection; run it inside run_transaction() to get its answer exactly once"
            )
        if outcome == "rolled_back":
            return (yield from self._again(sent, now))
        raise _unsettled(outcome, why, f"{op} (statement {sent.name})")

    def _again(self, sent: Sent, now: float) -> Settling:
        """Send a request that was not applied once more, under a new name."""
        call = sent.call
        arguments = _unnamed(call.arguments)
        timeout = arguments.get("timeout")
        if call.operation in WAITS and isinstance(timeout, (int, float)) and timeout > 0:
            arguments["timeout"] = max(0.0, timeout - (now - sent.at))  # the wait resumes
        again = self.prepare(calls.Call(call.operation, arguments, call.decode), now)
        if again is None:
            return None
        try:
            result = yield again
        except BrokerError:
            self.answered(again, False, None)
            raise
        self.answered(again, True, result)
        return result

    def _commit_outcome(self, txn: Txn, age: float, now: float) -> Settling:
        """The outcome of `txn`'s commit, asked once for all of its requests."""
        assert txn.id is not None
        if txn.outcome is None:
            outcome, why = yield _ask(calls.transaction_outcome(txn.id, age), now)
            txn.outcome = (outcome, why)
            self.settled[f"commit {outcome}"] += 1
        return txn.outcome

    def _settle_detached_commit(self, txn: Txn, age: float, now: float) -> Settling:
        assert txn.id is not None
        outcome, why = yield _ask(calls.transaction_outcome(txn.id, age), now)
        self.settled[f"commit {outcome}"] += 1
        if outcome == "open":
            return (yield _ask(calls.commit_transaction(txn.id), now))
        if outcome == "committed":
            return None
        raise _unsettled(outcome, why, f"commit of detached transaction {txn.id}")

    def reattach(self, now: float) -> Settling:
        """After a reconnect: attach again the detached transaction this session held."""
        txn = self.txn
        if txn is None or not txn.detached or txn.id is None:
            return None
        outcome, _ = yield _ask(calls.transaction_outcome(txn.id, None), now)
        if outcome == "open":
            yield _ask(calls.attach_transaction(txn.id), now)
            return None
        txn.broken = f"detached transaction {txn.id} ended while the connection was lost"
        return None


def _ask(call: calls.Call[Any], now: float) -> Sent:
    """A request made while settling another (a question, or a detached commit)."""
    return Sent(call, None, None, now)


def _unnamed(arguments: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if k not in ("txn", "txn_id")}


def _unsettled(outcome: str, why: str, what: str) -> BrokerError:
    if outcome == "rolled_back":
        return TransactionRolledBackError(
            f"the {what} was not applied: the connection was lost before the broker committed"
            " it, and the broker rolled it back"
        )
    return OutcomeUnknownError(
        f"the outcome of the {what} is unknown after the connection was lost: {why or outcome}"
    )
