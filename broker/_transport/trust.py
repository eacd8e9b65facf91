"""Trust between brokers: this broker's identity, the certificates it trusts, TLS, bindings.

Theory of operation. This broker proves itself with its identity (a key pair and a
self-signed certificate named by its instance id, see `identity`), and trusts exactly
the other brokers' certificates created with `create_certificate`: the link handshake
accepts only those, and so does mutual TLS, where each trusted certificate is its own
trust anchor and the broker id, not a host name, is checked (`tls_matches`: the TLS peer
is the broker of the handshake, no relay in between). A change of trust rebuilds the
trust store and the TLS contexts; new connections use them.

Each trusted certificate names the login its broker's messages act as (`login_of`;
none: PUBLIC), as Service Broker maps a remote broker's certificate to a user: a
message for a service of this broker needs that login's SEND permission on it.

A remote service binding names the broker that hosts a service: an encrypted dialog
(ENCRYPTION = ON) has its session keys wrapped for that broker's certificate, end to
end, and its messages go only to that broker (`encryption_refusal`, `recipient`).

Rotation replaces the identity in two steps that leave no moment in which a peer cannot
reach this broker: `next_broker_certificate` stages the next one, operators trust it on
every peer, then `rotate_broker_certificate` makes it current (old keys are kept to
unwrap session keys wrapped before) and every link reconnects to meet it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ssb.protocol import (
    Envelope,
    ErrorCode,
    LinkConnection,
    ProtocolError,
    Role,
    TrustStore,
    certificate_broker_id,
)

from .._core import catalog as cat
from .._core.ports import CatalogStatements, EndpointLookup, PeerCatalog
from .._core.transactions import Session
from .._core.transmission import DialogOutbox, Outbound
from .._errors import BrokerError, bad_argument
from .._tls import fingerprint
from .identity import Identity, IdentityFiles
from .settings import TransportSettings

log = logging.getLogger("ssb.transport")


class TrustListener(Protocol):
    """What the rest of the transport hears from trust."""

    def tls_changed(self) -> None:
        """New TLS contexts: connections accepted from now on use them."""

    def trust_added(self) -> None:
        """A certificate or binding was added: directions waiting for one may go now."""

    def rotated(self) -> None:
        """This broker's identity changed: dialogs learn its keys, links reconnect."""


class Trust:
    """This broker's identity and the other brokers it trusts."""

    def __init__(
        self,
        instance: uuid.UUID,
        data_dir: Path,
        catalog: PeerCatalog,
        statements: CatalogStatements,
        endpoints: EndpointLookup,
        settings: TransportSettings,
        listener: TrustListener,
        is_principal: Callable[[str], bool],
        identity_changed: Callable[[], None] = lambda: None,
    ) -> None:
        """`is_principal`: whether a certificate may name that login (or PUBLIC).
        `identity_changed` is told when this broker's identity files change (made,
        staged, rotated), to keep them in the store."""
        self.instance = instance
        self.catalog = catalog
        self.statements = statements
        self.endpoints = endpoints
        self.settings = settings
        self.listener = listener
        self.is_principal = is_principal
        self.files = IdentityFiles(data_dir, str(instance), identity_changed)
        self.identity: Identity = self.files.load()
        self.store = self._trust_store()
        self.tls_server, self.tls_client = self._tls_contexts()
        self.logins = self._logins()

    # ---- the handshake and TLS -----------------------------------------------------

    def _trust_store(self) -> TrustStore:
        return TrustStore([c.pem.encode() for c in self.catalog.peer_certificates()])

    def _tls_contexts(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """Mutual TLS with the broker identities: each side presents its broker
        certificate and accepts only the certificates this broker trusts (self-signed:
        each is its own trust anchor)."""
        if not self.settings.tls:
            return None, None
        trusted = "".join(c.pem for c in self.catalog.peer_certificates())
        contexts = []
        for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
            context = ssl.SSLContext(purpose)
            context.load_cert_chain(self.files.cert_path, self.files.key_path)
            context.check_hostname = False  # the broker id, not a host name, is checked
            context.verify_mode = ssl.CERT_REQUIRED
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            if trusted:
                context.load_verify_locations(cadata=trusted)
            contexts.append(context)
        return contexts[0], contexts[1]

    def _changed(self) -> None:
        self.logins = self._logins()
        self.store = self._trust_store()
        self.tls_server, self.tls_client = self._tls_contexts()
        self.listener.tls_changed()

    @staticmethod
    def tls_matches(transport: asyncio.BaseTransport | None, certificate_pem: bytes) -> bool:
        """The TLS peer is the broker of the link handshake (no relay in between)."""
        ssl_object = None if transport is None else transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return False
        der = ssl_object.getpeercert(binary_form=True)
        try:
            return bool(der) and der == ssl.PEM_cert_to_DER_cert(certificate_pem.decode())
        except ValueError:
            return False

    def _logins(self) -> dict[uuid.UUID, str | None]:
        """The login each trusted broker's messages act as (its first certificate's)."""
        logins: dict[uuid.UUID, str | None] = {}
        for cert in self.catalog.peer_certificates():
            logins.setdefault(uuid.UUID(cert.broker_instance), cert.login)
        return logins

    def login_of(self, instance: uuid.UUID) -> str | None:
        """The login broker `instance`'s messages act as (None: PUBLIC)."""
        return self.logins.get(instance)

    def trusted_certificates(self, instance: uuid.UUID) -> list[bytes]:
        """Every certificate of broker `instance` trusted here (two while it rotates)."""
        wanted = str(instance)
        return [
            c.pem.encode() for c in self.catalog.peer_certificates() if c.broker_instance == wanted
        ]

    def trusted_certificate(self, instance: uuid.UUID) -> bytes | None:
        for cert in self.catalog.peer_certificates():
            if cert.broker_instance == str(instance):
                return cert.pem.encode()
        return None

    def new_connection(self, role: Role, version: int) -> LinkConnection:
        """The sans-IO state of a new link, with this broker's identity and trust;
        `version`: the protocol version an initiator offers."""
        return LinkConnection(
            role,
            broker_id=self.instance,
            private_key=self.identity.private_key,
            certificate_pem=self.identity.certificate_pem,
            trusted=self.store,
            version=version,
        )

    # ---- encrypted dialogs ------------------------------------------------------------

    def encryption_refusal(self, box: DialogOutbox, peer: uuid.UUID) -> str | None:
        """Why an encrypted dialog's messages may not go to broker `peer` (None: they may)."""
        conversation_id, from_initiator = box.direction
        if not from_initiator:
            return None  # the target answers with the initiator broker's certificate
        ep = self.endpoints.by_conversation(conversation_id, True)
        if ep is None or not ep.encrypted:
            return None
        try:
            binding = self.catalog.binding_for(box.to_service)
        except BrokerError as exc:
            return str(exc)
        if binding.broker_instance != str(peer):
            return (
                f"ENCRYPTION = ON: the remote service binding '{binding.name}' names broker"
                f" {binding.broker_instance} for service '{box.to_service}', but the route"
                f" leads to broker {peer}"
            )
        return None

    def recipient(
        self, out: Outbound, peer_certificate: bytes, incoming: Envelope | None
    ) -> tuple[bool, bytes]:
        """Whether a new dialog direction is encrypted, and whose certificate its session
        key is wrapped for: the far service's binding for an encrypted initiator, else
        the peer's (`incoming`: the envelope of the direction a target answers). Placing
        the direction checked that the binding names the peer, so a binding dropped
        since leaves the peer's certificate: the same broker, never clear text (and never
        an exception in the middle of feeding the peer)."""
        if out.is_initiator:
            ep = self.endpoints.by_conversation(out.conversation_id, True)
            if ep is not None and ep.encrypted:
                binding = self.catalog.find_binding(out.to_service)
                return True, peer_certificate if binding is None else binding.pem.encode()
            return False, peer_certificate
        return incoming is not None and incoming.encrypted, peer_certificate

    # ---- operations ----------------------------------------------------------------------

    def operations(self) -> dict[str, Callable[..., Any]]:
        return {
            "broker_certificate": self.op_broker_certificate,
            "create_certificate": self.op_create_certificate,
            "drop_certificate": self.op_drop_certificate,
            "next_broker_certificate": self.op_next_broker_certificate,
            "rotate_broker_certificate": self.op_rotate_broker_certificate,
            "create_remote_service_binding": self.op_create_remote_service_binding,
            "drop_remote_service_binding": self.op_drop_remote_service_binding,
        }

    def op_broker_certificate(self, session: Session) -> str:
        return self.identity.certificate_pem.decode()

    def _peer_certificate(self, kind: str, name: object, pem: object) -> tuple[str, str]:
        """(name, broker instance) of a new catalog object holding another broker's
        certificate; raises if the name is taken or `pem` is not such a certificate."""
        name = cat.check_name(kind.replace("_", " "), name)
        if not isinstance(pem, str):
            raise bad_argument("pem must be the peer's certificate in PEM text")
        if self.catalog.exists(kind, name):
            raise BrokerError(
                ErrorCode.ALREADY_EXISTS, f"{kind.replace('_', ' ')} '{name}' already exists"
            )
        try:
            instance = certificate_broker_id(pem.encode())
            TrustStore([pem.encode()])
        except ProtocolError as exc:
            raise bad_argument(f"not a broker certificate: {exc}") from None
        if instance == self.instance:
            raise bad_argument("that is this broker's own certificate")
        return name, str(instance)

    def op_create_certificate(
        self, session: Session, name: object, pem: object, login: object = None
    ) -> None:
        name, instance = self._peer_certificate("certificate", name, pem)
        assert isinstance(pem, str)
        principal = None if isinstance(login, str) and login.lower() == "public" else login
        if principal is not None and (
            not isinstance(principal, str) or not self.is_principal(principal)
        ):
            raise BrokerError(
                ErrorCode.UNKNOWN_LOGIN,
                f"there is no login {login!r} for the certificate's broker to act as: create"
                " it first, or leave login out (the broker's messages then act as PUBLIC)",
            )
        for other in self.catalog.peer_certificates():
            if other.broker_instance == instance and other.login != principal:
                raise bad_argument(
                    f"certificate '{other.name}' of the same broker maps it to login"
                    f" {other.login or 'public'!r}; one broker acts as one login: give this"
                    " certificate the same login, or drop the other first"
                )
        self.statements.persist("certificate", cat.Certificate(name, pem, instance, principal))
        self._changed()
        self.listener.trust_added()

    def op_drop_certificate(self, session: Session, name: object) -> None:
        if not isinstance(name, str):
            raise bad_argument("drop_certificate needs a certificate name")
        self.statements.drop(session, "certificate", name)
        self._changed()

    def op_create_remote_service_binding(
        self, session: Session, name: object, service: object, pem: object
    ) -> None:
        name, instance = self._peer_certificate("remote_service_binding", name, pem)
        if not isinstance(service, str) or not service:
            raise bad_argument("service must be the name of the remote service")
        assert isinstance(pem, str)
        binding = cat.RemoteServiceBinding(name, service, pem, instance)
        self.statements.persist("remote_service_binding", binding)
        self.listener.trust_added()

    def op_drop_remote_service_binding(self, session: Session, name: object) -> None:
        if not isinstance(name, str):
            raise bad_argument("drop_remote_service_binding needs a binding name")
        self.statements.drop(session, "remote_service_binding", name)

    def op_next_broker_certificate(self, session: Session) -> str:
        pem = self.files.stage_next()
        log.info("next broker certificate staged; trust it on every peer, then rotate")
        return pem.decode()

    def op_rotate_broker_certificate(self, session: Session) -> str:
        if not self.files.has_next():
            raise bad_argument(
                "no next certificate is staged: call next_broker_certificate() first and"
                " trust what it returns on every peer (create_certificate)"
            )
        self.identity = self.files.rotate()
        self._changed()
        self.listener.rotated()
        log.info(
            "broker certificate rotated; %d previous key(s) kept", len(self.identity.previous_keys)
        )
        return self.identity.certificate_pem.decode()

    # ---- views ----------------------------------------------------------------------------

    def certificates_view(self) -> list[dict[str, Any]]:
        """The peer brokers' certificates this broker trusts (CREATE CERTIFICATE)."""
        return [
            {
                "name": c.name,
                "broker_instance": c.broker_instance,
                "fingerprint": fingerprint(c.pem),
                "login": c.login or "public",
            }
            for c in sorted(self.catalog.peer_certificates(), key=lambda c: c.name)
        ]

    def bindings_view(self) -> list[dict[str, Any]]:
        return [
            {"name": b.name, "remote_service_name": b.service, "broker_instance": b.broker_instance}
            for b in sorted(self.catalog.remote_service_bindings(), key=lambda b: b.name)
        ]
