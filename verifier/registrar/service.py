"""Registrar logic over the database (no HTTP here).

A registration replaces the one in force only once its AK is activated
(ARCHITECTURE "Parties and trust", registrar): :meth:`Registrar.register`
stores the new EK/AK/TLS certificate/address as a *pending* registration
keyed by its challenge, and :meth:`Registrar.activate` promotes it when
the TPM answers. Whoever knows a node's (public) EK can therefore add
pending registrations, but cannot change or deactivate the node's
registration in force.

Anonymous registrations (a node with no operator-issued certificate,
whose identity is its TPM) must carry an EK certificate that chains to
the configured EK anchors; without anchors they are refused.

A vTPM that Nova's libvirt driver made is bound to its compute host
instead (:mod:`verifier.registrar.hosts`): once the provider has enrolled
any host's vTPM CA, a registration under a UUID whose placement is known
(or whose EK certificate an enrolled host CA signed) must pass
:func:`~verifier.protocol.ekcert.check_host_bound_ek`, anonymous or not;
its refusals are 403 with the check's reason and store nothing.

With ``[registrar] host_trust = required`` (the default) that check runs
behind the host gate (:mod:`verifier.protocol.hosttrust`): the placed host
must be attested with its enrolled CA proven, as the verifier last said.
"""

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

from verifier.db import (
    InstancePlacement,
    PendingRegistration,
    ProviderEk,
    RegisteredAgent,
)
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
from verifier.protocol.ekcert import check_ek_certificate, named_instance
from verifier.protocol.hosttrust import HostTrustMode
from verifier.registrar.gate import check_host_gate
from verifier.registrar.hosts import HostRegistry
from verifier.registrar.hosts import forget_pending as _forget_pending

#: Seconds a pending registration may wait for its activation.
PENDING_TTL = 600.0
#: Pending registrations kept per node (the oldest go first).
MAX_PENDING_PER_NODE = 4
#: UUIDs per SQL ``IN`` list of a batch look-up (:meth:`Registrar.lookup`).
LOOKUP_CHUNK = 500


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
class StoredProviderEk:
    """A vTPM's EK registered by the provider under the instance UUID."""

    uuid: str
    ek_public: bytes
    ek_certificate: bytes | None
    provider: str

    @classmethod
    def from_row(cls, row: ProviderEk) -> StoredProviderEk:
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
        host_trust: whether a host-bound vTPM's host must be attested and
            have proved its CA (``[registrar] host_trust``).
    """

    def __init__(
        self,
        engine: sa.Engine,
        ek_anchors: Sequence[x509.Certificate] = (),
        require_ek_certificate: bool = False,
        *,
        host_trust: HostTrustMode = HostTrustMode.REQUIRED,
    ) -> None:
        self._engine = engine
        self._anchors = list(ek_anchors)
        self._require_cert = require_ek_certificate
        self._host_trust = host_trust
        self.hosts = HostRegistry(engine)

    def _check_ek(
        self, ek_public: bytes, ek_certificate: bytes | None, bound: bool = False
    ) -> TpmPublic:
        ek = TpmPublic.from_bytes(ek_public)
        try:
            check_ek_template(ek)
            if bound:
                pass  # check_host_bound_ek checked the certificate
            elif ek_certificate is None:
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

    def _check_identity(
        self, reg: Registration, bound: bool = False
    ) -> tuple[TpmPublic, TpmPublic]:
        ek = self._check_ek(reg.ek_public, reg.ek_certificate, bound)
        ak = TpmPublic.from_bytes(reg.ak_public)
        try:
            check_ak_template(ak)
        except EvidenceError as exc:
            raise RequestError(exc.reason, exc.detail)
        return ek, ak

    def _check_anonymous(self, reg: Registration) -> None:
        """An anonymous caller proves its identity by its TPM's EK cert."""
        if not self._anchors:
            raise RequestError(
                "anonymous_registration_disabled",
                "registration without a client certificate needs EK anchors "
                "([registrar] ek_ca_bundle), and none are configured",
                403,
            )
        if reg.ek_certificate is None:
            raise RequestError(
                "ek_certificate_required",
                "a registration without a client certificate must carry an EK "
                "certificate that chains to the registrar's EK anchors",
                403,
            )
        named = named_instance(reg.ek_certificate)
        if named is not None and named != canonical_uuid(reg.uuid):
            raise RequestError(
                "ek_certificate_other_instance",
                f"the EK certificate names instance {named}, not {reg.uuid}",
                403,
            )

    def register(
        self, reg: Registration, anonymous: bool = False
    ) -> CredentialChallenge:
        """Challenge a node to activate its AK; store it as pending.

        The registration in force (if any) is unchanged until
        :meth:`activate` answers this challenge.

        Args:
            reg: what the node sent.
            anonymous: the caller presented no client certificate; its
                EK certificate must chain to the EK anchors (or, for a
                host-bound vTPM, to its host's enrolled CA).

        Raises:
            RequestError: bad keys or EK certificate; (403) a reason of
                :func:`check_host_bound_ek` for a host-bound vTPM;
                ``ek_certificate_required`` or
                ``anonymous_registration_disabled`` for anonymous callers.
            ConflictError: the UUID is registered with another EK, or the
                provider registered another EK (the vTPM) for it.
        """
        uuid = canonical_uuid(reg.uuid)
        binding = self.hosts.binding(uuid)
        bound = check_host_gate(
            uuid, reg.ek_public, reg.ek_certificate, binding, self._host_trust
        )
        if not bound and anonymous:
            self._check_anonymous(reg)
        ek, ak = self._check_identity(reg, bound)
        credential = os.urandom(32)
        challenge = make_credential(ek, ak.name, credential)
        now = time.time()
        with Session(self._engine) as session, session.begin():
            self._check_ek_in_force(session, uuid, reg.ek_public)
            self._prune_pending(session, uuid, now)
            session.add(
                PendingRegistration(
                    challenge_digest=hashlib.sha256(credential).hexdigest(),
                    uuid=uuid,
                    ek_public=reg.ek_public,
                    ek_certificate=reg.ek_certificate,
                    ak_public=reg.ak_public,
                    tls_cert=reg.tls_cert,
                    host=reg.host,
                    port=reg.port,
                    created_at=now,
                )
            )
        return challenge

    @staticmethod
    def _check_ek_in_force(session: Session, uuid: str, ek_public: bytes) -> None:
        provided = session.get(ProviderEk, uuid)
        if provided is not None and provided.ek_public != ek_public:
            raise ConflictError(
                "ek_not_provider",
                f"node {uuid} presents an EK other than the vTPM EK the "
                f"provider {provided.provider!r} registered for it",
            )
        row = session.get(RegisteredAgent, uuid)
        if row is not None and row.ek_public != ek_public:
            raise ConflictError(
                "ek_mismatch", f"node {uuid} is registered with another EK"
            )

    @staticmethod
    def _prune_pending(session: Session, uuid: str, now: float) -> None:
        """Drop expired pending registrations, and this node's oldest ones
        beyond :data:`MAX_PENDING_PER_NODE` - 1 (room for the new one)."""
        session.execute(
            sa.delete(PendingRegistration).where(
                PendingRegistration.created_at < now - PENDING_TTL
            )
        )
        stale = session.scalars(
            sa.select(PendingRegistration.challenge_digest)
            .where(PendingRegistration.uuid == uuid)
            .order_by(PendingRegistration.created_at.desc())
            .offset(MAX_PENDING_PER_NODE - 1)
        ).all()
        if stale:
            session.execute(
                sa.delete(PendingRegistration).where(
                    PendingRegistration.challenge_digest.in_(stale)
                )
            )

    def activate(self, uuid: str, credential: bytes) -> None:
        """Put in force the pending registration ``credential`` answers.

        Raises:
            NotFoundError: nothing is registered or pending for ``uuid``.
            RequestError: (403) the host gate's reasons, judged again (the
                host lost its trust since the registration);
                (403) ``activation_failed``: no pending
                registration of this node answers to ``credential``.
            ConflictError: the EK in force or the provider's EK changed
                since the registration.
        """
        uuid = canonical_uuid(uuid)
        digest = hashlib.sha256(credential).digest()
        self._gate_again(uuid, digest.hex())
        now = time.time()
        with Session(self._engine) as session, session.begin():
            pending = session.get(PendingRegistration, digest.hex())
            if (
                pending is not None
                and pending.uuid == uuid
                and pending.created_at >= now - PENDING_TTL
            ):
                self._check_ek_in_force(session, uuid, pending.ek_public)
                self._promote(session, pending, now)
                return
            row = session.get(RegisteredAgent, uuid)
            if row is None and not _has_pending(session, uuid):
                raise NotFoundError("unknown_node", f"node {uuid} is not registered")
            # A challenge issued before the upgrade to pending registrations.
            legacy = row.challenge_digest if row is not None else None
            if legacy is None or not hmac.compare_digest(legacy, digest):
                raise RequestError(
                    "activation_failed",
                    "credential does not answer a pending registration "
                    "challenge of this node",
                    403,
                )
            assert row is not None
            row.activated = True
            row.challenge_digest = None
            row.updated_at = now

    def _gate_again(self, uuid: str, challenge_digest: str) -> None:
        """The host gate once more for the pending registration this
        credential answers (its host may have lost its trust since).

        Raises:
            RequestError: (403) as at registration.
        """
        with Session(self._engine) as session:
            pending = session.get(PendingRegistration, challenge_digest)
            if pending is None or pending.uuid != uuid:
                return  # activate() refuses it
            ek_public, ek_certificate = pending.ek_public, pending.ek_certificate
        binding = self.hosts.binding(uuid)
        check_host_gate(uuid, ek_public, ek_certificate, binding, self._host_trust)

    @staticmethod
    def _promote(session: Session, pending: PendingRegistration, now: float) -> None:
        row = session.get(RegisteredAgent, pending.uuid)
        if row is None:
            row = RegisteredAgent(uuid=pending.uuid, created_at=now)
            session.add(row)
        row.ek_public = pending.ek_public
        row.ek_certificate = pending.ek_certificate
        row.ak_public = pending.ak_public
        row.tls_cert = pending.tls_cert
        row.host, row.port = pending.host, pending.port
        row.challenge_digest = None
        row.activated = True
        row.updated_at = now
        session.execute(
            sa.delete(PendingRegistration).where(
                PendingRegistration.uuid == pending.uuid
            )
        )

    def get(self, uuid: str) -> AgentRecord:
        """Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session:
            row = session.get(RegisteredAgent, uuid)
            if row is None:
                raise NotFoundError("unknown_node", f"node {uuid} is not registered")
            return AgentRecord.from_row(row)

    def lookup(self, uuids: Sequence[str]) -> tuple[list[AgentRecord], dict[str, str]]:
        """The registrations of those of ``uuids`` the registrar knows, and
        the compute host recorded for those Nova placed: one read for a
        batch of enrolments (``POST /v1/lookup/agents``). Unknown UUIDs
        are left out of both; ``uuids`` must be canonical."""
        wanted = sorted(set(uuids))
        records: list[AgentRecord] = []
        hosts: dict[str, str] = {}
        with Session(self._engine) as session:
            for start in range(0, len(wanted), LOOKUP_CHUNK):
                chunk = wanted[start : start + LOOKUP_CHUNK]
                agents = sa.select(RegisteredAgent).where(
                    RegisteredAgent.uuid.in_(chunk)
                )
                records.extend(AgentRecord.from_row(r) for r in session.scalars(agents))
                placed = sa.select(
                    InstancePlacement.uuid, InstancePlacement.host
                ).where(InstancePlacement.uuid.in_(chunk))
                hosts.update((uuid, host) for uuid, host in session.execute(placed))
        return records, hosts

    def list(self) -> list[AgentRecord]:
        with Session(self._engine) as session:
            rows = session.scalars(sa.select(RegisteredAgent).order_by("uuid"))
            return [AgentRecord.from_row(r) for r in rows]

    def delete(self, uuid: str) -> None:
        """Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session, session.begin():
            row = session.get(RegisteredAgent, uuid)
            forgotten = _forget_pending(session, uuid)
            if row is None and not forgotten:
                raise NotFoundError("unknown_node", f"node {uuid} is not registered")
            if row is not None:
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

    def get_provider_ek(self, uuid: str) -> StoredProviderEk:
        """Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session:
            row = session.get(ProviderEk, uuid)
            if row is None:
                raise NotFoundError(
                    "unknown_instance", f"no vTPM EK is registered for {uuid}"
                )
            return StoredProviderEk.from_row(row)

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
            _forget_pending(session, uuid)


def _has_pending(session: Session, uuid: str) -> bool:
    query = sa.select(PendingRegistration.challenge_digest).where(
        PendingRegistration.uuid == uuid
    )
    return session.scalars(query.limit(1)).first() is not None
