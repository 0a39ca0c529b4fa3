"""Compute hosts' vTPM CAs and Nova's instance placements (no HTTP here).

The provider enrols each compute host's swtpm local CA under the host's
name (``trusted-vtpm-manager enrol-host``) and records which host Nova
placed each instance on (the listener's ``vtpm`` instance hook, from
Nova's notifications). :class:`HostRegistry` stores both;
:meth:`HostRegistry.binding` gives the registrar what
:func:`verifier.protocol.ekcert.check_host_bound_ek` needs.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import sqlalchemy as sa
from cryptography import x509
from sqlalchemy.orm import Session

from verifier.db import (
    HostCa,
    InstancePlacement,
    PendingRegistration,
    RegisteredAgent,
)
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol import canonical_uuid
from verifier.protocol.ekcert import load_host_ca
from verifier.protocol.errors import MalformedError
from verifier.protocol.hosttrust import HostTrust
from verifier.protocol.messages.provider import check_host_name as _check_field

#: Parsed host CAs kept (one per enrolled compute host; a CA is at most
#: 32 KiB of PEM).
PARSED_CAS = 4096

__all__ = ["HostBinding", "HostRegistry", "forget_pending"]


def _check_host_name(host: str) -> str:
    """Raises: RequestError (400 ``bad_host``) for a name that is no host."""
    try:
        _check_field("compute host", "host", host)
    except MalformedError as exc:
        raise RequestError("bad_host", exc.detail)
    return host


@dataclasses.dataclass(frozen=True)
class HostBinding:
    """What the registrar knows to bind an instance's vTPM EK to its host.

    Attributes:
        placed_host: the host whose CA made the vTPM's EK certificate (the
            first host Nova placed the instance on), None if unknown.
        current_host: where Nova runs it now (None if unknown).
        anchors: every enrolled host's CA certificates, by host.
        ca_pems: every enrolled host's CA PEM as stored, by host.
        trust: the trust record of every host the verifier spoke of.
    """

    placed_host: str | None
    current_host: str | None
    anchors: dict[str, list[x509.Certificate]]
    ca_pems: dict[str, bytes] = dataclasses.field(default_factory=dict)
    trust: dict[str, HostTrust] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HostCaRecord:
    host: str
    ca_pem: str
    provider: str


class HostRegistry:
    """Host CAs and instance placements in the registrar database."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    # -- host CAs -----------------------------------------------------------

    def put_host_ca(self, host: str, ca_pem: str, provider: str) -> bool:
        """Enrol or replace ``host``'s swtpm local CA; True if new.

        Raises:
            RequestError: ``bad_host`` or (400) ``bad_host_ca`` naming why
                the PEM is no CA certificate; nothing is stored then.
        """
        _check_host_name(host)
        try:
            load_host_ca(ca_pem.encode())
        except (MalformedError, UnicodeError) as exc:
            raise RequestError("bad_host_ca", str(exc))
        with Session(self._engine) as session, session.begin():
            row = session.get(HostCa, host)
            created = row is None
            if row is None:
                row = HostCa(host=host)
                session.add(row)
            row.ca_pem, row.provider, row.updated_at = ca_pem, provider, time.time()
        return created

    def get_host_ca(self, host: str) -> HostCaRecord:
        """Raises: NotFoundError (``unknown_host``)."""
        _check_host_name(host)
        with Session(self._engine) as session:
            row = session.get(HostCa, host)
            if row is None:
                raise NotFoundError("unknown_host", f"no vTPM CA enrolled for {host!r}")
            return HostCaRecord(row.host, row.ca_pem, row.provider)

    def delete_host_ca(self, host: str) -> None:
        """Raises: NotFoundError (``unknown_host``)."""
        _check_host_name(host)
        with Session(self._engine) as session, session.begin():
            row = session.get(HostCa, host)
            if row is None:
                raise NotFoundError("unknown_host", f"no vTPM CA enrolled for {host!r}")
            session.delete(row)

    # -- host trust (the verifier's word) -----------------------------------

    def put_trust(self, host: str, trust: HostTrust) -> tuple[HostTrust, bool]:
        """Record the verifier's word on ``host`` unless it is older than
        the one held (a delayed retry never re-trusts a failed host).

        Returns:
            (the record now held, whether ``trust`` was applied).

        Raises:
            RequestError: ``bad_host``.
            NotFoundError: ``unknown_host``, no vTPM CA is enrolled for it
                (nothing is stored).
        """
        _check_host_name(host)
        with Session(self._engine) as session, session.begin():
            row = session.get(HostCa, host)
            if row is None:
                raise NotFoundError("unknown_host", f"no vTPM CA enrolled for {host!r}")
            held = _trust_of(row)
            if held is not None and held.as_of > trust.as_of:
                return held, False
            row.trusted, row.trust_ca_sha256 = trust.trusted, trust.ca_sha256
            row.trust_provider_uuid, row.trust_as_of = trust.provider, trust.as_of
        return trust, True

    def get_trust(self, host: str) -> HostTrust | None:
        """The trust record of ``host`` (None: the verifier never spoke).

        Raises:
            RequestError: ``bad_host``; NotFoundError: ``unknown_host``.
        """
        _check_host_name(host)
        with Session(self._engine) as session:
            row = session.get(HostCa, host)
            if row is None:
                raise NotFoundError("unknown_host", f"no vTPM CA enrolled for {host!r}")
            return _trust_of(row)

    # -- placements ---------------------------------------------------------

    def put_placement(self, uuid: str, host: str, provider: str) -> bool:
        """Record that Nova runs instance ``uuid`` on ``host``; True if new.

        The first host stays the instance's origin (its CA made the EK
        certificate, which resize and cold migration carry along).
        """
        uuid = canonical_uuid(uuid)
        _check_host_name(host)
        with Session(self._engine) as session, session.begin():
            row = session.get(InstancePlacement, uuid)
            created = row is None
            if row is None:
                row = InstancePlacement(uuid=uuid, origin_host=host)
                session.add(row)
            row.host, row.provider, row.updated_at = host, provider, time.time()
        return created

    def get_placement(self, uuid: str) -> tuple[str, str]:
        """(current host, origin host). Raises: NotFoundError."""
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session:
            row = session.get(InstancePlacement, uuid)
            if row is None:
                raise NotFoundError(
                    "unknown_instance", f"no compute host is recorded for {uuid}"
                )
            return row.host, row.origin_host

    def delete_placement(self, uuid: str) -> None:
        """Forget a deleted instance: its placement, and any agent
        registration (in force or pending) under its UUID, so its vTPM's
        EK cannot be presented again.

        Raises: NotFoundError (``unknown_instance``).
        """
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session, session.begin():
            row = session.get(InstancePlacement, uuid)
            if row is None:
                raise NotFoundError(
                    "unknown_instance", f"no compute host is recorded for {uuid}"
                )
            session.delete(row)
            agent = session.get(RegisteredAgent, uuid)
            if agent is not None:
                session.delete(agent)
            forget_pending(session, uuid)

    # -- the binding --------------------------------------------------------

    def binding(self, uuid: str) -> HostBinding | None:
        """The host binding for ``uuid``; None when no host CA is enrolled
        at all (the registrar then checks EK certificates as before).

        A stored CA that no longer parses is skipped: its host has no
        anchors and the check fails closed with ``host_ca_unknown``.
        """
        uuid = canonical_uuid(uuid)
        with Session(self._engine) as session:
            # the columns only, no ORM objects: every host's row is read at
            # each registration and activation
            rows = session.execute(sa.select(*_BINDING_COLUMNS)).all()
            if not rows:
                return None
            anchors: dict[str, list[x509.Certificate]] = {}
            pems: dict[str, bytes] = {}
            trust: dict[str, HostTrust] = {}
            for row in rows:
                held = _trust_of(row)
                if held is not None:
                    trust[row.host] = held
                try:
                    pems[row.host] = row.ca_pem.encode()
                except UnicodeError:
                    continue
                parsed = parsed_host_ca(pems[row.host])
                if parsed is not None:
                    anchors[row.host] = list(parsed)
            placement = session.get(InstancePlacement, uuid)
            if placement is None:
                return HostBinding(None, None, anchors, pems, trust)
            return HostBinding(
                placement.origin_host, placement.host, anchors, pems, trust
            )


@functools.lru_cache(maxsize=PARSED_CAS)
def parsed_host_ca(pem: bytes) -> tuple[x509.Certificate, ...] | None:
    """A host CA's certificates, parsed once per PEM (None: it does not
    parse): :meth:`HostRegistry.binding` needs every enrolled host's CA
    at each registration and again at its activation, and parsing them
    all each time cost O(hosts) per agent. Certificates are immutable; a
    replaced CA is another PEM, so another entry."""
    try:
        return tuple(load_host_ca(pem))
    except MalformedError:
        return None


_BINDING_COLUMNS = (
    HostCa.host,
    HostCa.ca_pem,
    HostCa.trusted,
    HostCa.trust_ca_sha256,
    HostCa.trust_provider_uuid,
    HostCa.trust_as_of,
)


def _trust_of(row: Any) -> HostTrust | None:
    """The trust record a host CA row holds (None: never told, or a row
    half written by hand: fail closed)."""
    if row.trusted is None or row.trust_as_of is None or not row.trust_provider_uuid:
        return None
    return HostTrust(
        bool(row.trusted), row.trust_ca_sha256, row.trust_provider_uuid, row.trust_as_of
    )


def forget_pending(session: Session, uuid: str) -> int:
    """Delete ``uuid``'s pending registrations; return how many there were."""
    pending = session.scalars(
        sa.select(PendingRegistration).where(PendingRegistration.uuid == uuid)
    ).all()
    for row in pending:
        session.delete(row)
    return len(pending)
