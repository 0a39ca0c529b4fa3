"""Registrar logic over the database (no HTTP here)."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import os
import time
from collections.abc import Sequence

import sqlalchemy as sa
from cryptography import x509
from sqlalchemy.orm import Session

from verifier.db import ProviderEk, RegisteredAgent
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol import (
    CredentialChallenge,
    EvidenceError,
    TpmPublic,
    canonical_uuid,
    check_ak_template,
    make_credential,
)
from verifier.protocol.credential import check_ek_template
from verifier.protocol.ekcert import check_ek_certificate


@dataclasses.dataclass(frozen=True)
class Registration:
    """What a node sends to register."""

    uuid: str
    ek_public: bytes
    ek_certificate: bytes | None
    ak_public: bytes
    tls_cert: str
    host: str
    port: int


@dataclasses.dataclass(frozen=True)
class ProviderEkRecord:
    """A vTPM's EK registered by the provider under the instance UUID."""

    uuid: str
    ek_public: bytes
    ek_certificate: bytes | None
    provider: str

    @classmethod
    def from_row(cls, row: ProviderEk) -> ProviderEkRecord:
        return cls(row.uuid, row.ek_public, row.ek_certificate, row.provider)


@dataclasses.dataclass(frozen=True)
class AgentRecord:
    """A registered node, as the registrar answers for it."""

    uuid: str
    ek_public: bytes
    ek_certificate: bytes | None
    ak_public: bytes
    tls_cert: str
    host: str
    port: int
    activated: bool

    @classmethod
    def from_row(cls, row: RegisteredAgent) -> AgentRecord:
        return cls(
            row.uuid,
            row.ek_public,
            row.ek_certificate,
            row.ak_public,
            row.tls_cert,
            row.host,
            row.port,
            row.activated,
        )


class Registrar:
    """Registers and activates node TPM identities.

    Args:
        engine: the registrar database.
        ek_anchors: trusted EK CA certificates (empty: EK certs unchecked).
        require_ek_certificate: refuse registrations without an EK cert.
    """

    def __init__(
        self,
        engine: sa.Engine,
        ek_anchors: Sequence[x509.Certificate] = (),
        require_ek_certificate: bool = False,
    ) -> None:
        self._engine = engine
        self._anchors = list(ek_anchors)
        self._require_cert = require_ek_certificate

    def _check_ek(self, ek_public: bytes, ek_certificate: bytes | None) -> TpmPublic:
        ek = TpmPublic.from_bytes(ek_public)
        try:
            check_ek_template(ek)
            if ek_certificate is None:
                if self._require_cert:
                    raise EvidenceError(
                        "ek_certificate", "an EK certificate is required"
                    )
            elif self._anchors:
                now = datetime.datetime.now(datetime.UTC)
                check_ek_certificate(ek_certificate, ek, self._anchors, now)
        except EvidenceError as exc:
            raise RequestError(exc.reason, exc.detail)
        return ek

    def _check_identity(self, reg: Registration) -> tuple[TpmPublic, TpmPublic]:
        ek = self._check_ek(reg.ek_public, reg.ek_certificate)
        ak = TpmPublic.from_bytes(reg.ak_public)
        try:
            check_ak_template(ak)
        except EvidenceError as exc:
            raise RequestError(exc.reason, exc.detail)
        return ek, ak

    def register(self, reg: Registration) -> CredentialChallenge:
        """Record a node's EK and AK and challenge it to activate the AK.

        Raises:
            RequestError: bad keys or EK certificate.
            ConflictError: the UUID is registered with another EK, or the
                provider registered another EK (the vTPM) for it.
        """
        uuid = canonical_uuid(reg.uuid)
        ek, ak = self._check_identity(reg)
        credential = os.urandom(32)
        challenge = make_credential(ek, ak.name, credential)
        now = time.time()
        with Session(self._engine) as session, session.begin():
            provided = session.get(ProviderEk, uuid)
            if provided is not None and provided.ek_public != reg.ek_public:
                raise ConflictError(
                    "ek_not_provider",
                    f"node {uuid} presents an EK other than the vTPM EK the "
                    f"provider {provided.provider!r} registered for it",
                )
            row = session.get(RegisteredAgent, uuid)
            if row is not None and row.ek_public != reg.ek_public:
                raise ConflictError(
                    "ek_mismatch", f"node {uuid} is registered with another EK"
                )
            if row is None:
                row = RegisteredAgent(uuid=uuid, created_at=now)
                session.add(row)
            row.ek_public = reg.ek_public
            row.ek_certificate = reg.ek_certificate
            row.ak_public = reg.ak_public
            row.tls_cert = reg.tls_cert
            row.host, row.port = reg.host, reg.port
            row.challenge_digest = hashlib.sha256(credential).digest()
            row.activated = False
            row.updated_at = now
        return challenge

    def activate(self, uuid: str, credential: bytes) -> None:
        """Mark the AK activated if ``credential`` answers the challenge.

        Raises:
            NotFoundError: unknown node.
            RequestError: (403) wrong credential or no pending challenge.
        """
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session, session.begin():
            row = session.get(RegisteredAgent, uuid)
            if row is None:
                raise NotFoundError("unknown_node", f"node {uuid} is not registered")
            expected = row.challenge_digest
            digest = hashlib.sha256(credential).digest()
            if expected is None or not hmac.compare_digest(expected, digest):
                raise RequestError(
                    "activation_failed",
                    "credential does not answer the registration challenge",
                    403,
                )
            row.activated = True
            row.challenge_digest = None
            row.updated_at = time.time()

    def get(self, uuid: str) -> AgentRecord:
        """Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session:
            row = session.get(RegisteredAgent, uuid)
            if row is None:
                raise NotFoundError("unknown_node", f"node {uuid} is not registered")
            return AgentRecord.from_row(row)

    def list(self) -> list[AgentRecord]:
        with Session(self._engine) as session:
            rows = session.scalars(sa.select(RegisteredAgent).order_by("uuid"))
            return [AgentRecord.from_row(r) for r in rows]

    def delete(self, uuid: str) -> None:
        """Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session, session.begin():
            row = session.get(RegisteredAgent, uuid)
            if row is None:
                raise NotFoundError("unknown_node", f"node {uuid} is not registered")
            session.delete(row)

    # -- provider registrations (vTPM EKs under instance UUIDs) ------------

    def register_provider_ek(
        self,
        uuid: str,
        ek_public: bytes,
        ek_certificate: bytes | None,
        provider: str,
    ) -> bool:
        """Record the EK of an instance's vTPM as its provider created it.

        Idempotent for the same EK. A later agent registration under
        ``uuid`` must present this EK.

        Args:
            uuid: the instance UUID.
            ek_public: the vTPM EK, marshalled TPM2B_PUBLIC.
            ek_certificate: its DER EK certificate, if any.
            provider: who registered it (client certificate name).

        Returns:
            True if newly recorded, False if it was already.

        Raises:
            RequestError: bad EK or EK certificate.
            ConflictError: another EK is already registered for ``uuid``
                (by the provider, or by an agent).
        """
        uuid = canonical_uuid(uuid)
        self._check_ek(ek_public, ek_certificate)
        with Session(self._engine) as session, session.begin():
            row = session.get(ProviderEk, uuid)
            if row is not None:
                if row.ek_public != ek_public:
                    raise ConflictError(
                        "provider_ek_conflict",
                        f"instance {uuid} already has another vTPM EK, registered "
                        f"by {row.provider!r}: refusing to replace it (an attack "
                        "or a bug; delete the old registration first)",
                    )
                return False
            agent = session.get(RegisteredAgent, uuid)
            if agent is not None and agent.ek_public != ek_public:
                raise ConflictError(
                    "provider_ek_conflict",
                    f"node {uuid} is already registered by its agent with another EK",
                )
            session.add(
                ProviderEk(
                    uuid=uuid,
                    ek_public=ek_public,
                    ek_certificate=ek_certificate,
                    provider=provider,
                    created_at=time.time(),
                )
            )
        return True

    def get_provider_ek(self, uuid: str) -> ProviderEkRecord:
        """Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session:
            row = session.get(ProviderEk, uuid)
            if row is None:
                raise NotFoundError(
                    "unknown_instance", f"no vTPM EK is registered for {uuid}"
                )
            return ProviderEkRecord.from_row(row)

    def delete_provider_ek(self, uuid: str) -> None:
        """Forget an instance: its provider EK and any agent registration.

        Raises: NotFoundError.
        """
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session, session.begin():
            row = session.get(ProviderEk, uuid)
            if row is None:
                raise NotFoundError(
                    "unknown_instance", f"no vTPM EK is registered for {uuid}"
                )
            session.delete(row)
            agent = session.get(RegisteredAgent, uuid)
            if agent is not None:
                session.delete(agent)
