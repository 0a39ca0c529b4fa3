"""The verifier's table of compute hosts (``verifier_hosts``, beside their
node rows of kind ``host``) and the guests' current hosts.

A host is enrolled in one transaction with its node row; a second claim of
its provider, host name or TPM is refused naming which
(:class:`HostClaimError`), whichever verifier races.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from verifier.db import Host, Node
from verifier.exceptions import ConflictError
from verifier.protocol import MalformedError, canonical_uuid

__all__ = ["GUEST", "HOST", "GuestRef", "HostStore"]

#: The node kinds (the ``kind`` column).
GUEST = "guest"
HOST = "host"


@dataclasses.dataclass(frozen=True)
class GuestRef:
    """A guest on a host: its UUID and owning project."""

    uuid: str
    project_id: str


class HostStore:
    """Reads and writes of ``verifier_hosts`` and of the guests' hosts.

    Args:
        engine: the verifier database.
        clock: wall clock (seconds).
    """

    def __init__(self, engine: sa.Engine, clock: Callable[[], float]) -> None:
        self.engine = engine
        self._clock = clock

    def insert(self, node: Node, host: Host) -> None:
        """Enrol a host: its node row and its host row, together.

        Raises:
            ConflictError: ``provider_claimed``, ``hypervisor_claimed`` or
                ``tpm_claimed``: another enrolment holds it.
        """
        try:
            session = Session(self.engine, expire_on_commit=False)
            with session, session.begin():
                self._check_claims(session, host)
                session.add(node)
                session.flush()
                session.add(host)
            session.expunge_all()
        except IntegrityError:  # a race: name what the winner holds
            with Session(self.engine) as session:
                self._check_claims(session, host)
            raise ConflictError(
                "provider_claimed", f"provider {host.uuid} is already enrolled"
            ) from None

    @staticmethod
    def _check_claims(session: Session, host: Host) -> None:
        if session.get(Node, host.uuid) is not None:
            raise ConflictError(
                "provider_claimed",
                f"provider {host.uuid} is already enrolled (as a host or a node)",
            )
        claims = (
            (Host.hypervisor_hostname, host.hypervisor_hostname, "hypervisor_claimed",
             f"hypervisor host name {host.hypervisor_hostname!r}"),
            (Host.ek_sha256, host.ek_sha256, "tpm_claimed",
             f"the TPM of provider {host.uuid} (EK sha256 {host.ek_sha256})"),
        )  # fmt: skip
        for column, value, code, what in claims:
            other = session.scalar(sa.select(Host.uuid).where(column == value))
            if other is not None:
                raise ConflictError(code, f"{what} is already enrolled as host {other}")

    def find(self, ref: str) -> Host | None:
        """The host of provider UUID or hypervisor host name ``ref``."""
        with Session(self.engine) as session:
            query = sa.select(Host).where(Host.hypervisor_hostname == ref)
            row = session.scalar(query)
            if row is None:
                try:
                    row = session.get(Host, canonical_uuid(ref))
                except MalformedError:  # a name, not a UUID
                    row = None
            if row is not None:
                session.expunge(row)
            return row

    def all(self) -> list[Host]:
        with Session(self.engine) as session:
            rows = list(
                session.scalars(sa.select(Host).order_by(Host.hypervisor_hostname))
            )
            session.expunge_all()
            return rows

    def host_states(self) -> dict[str, tuple[str, str | None]]:
        """Provider UUID -> (state, failure reason) of every host's node."""
        query = sa.select(Node.uuid, Node.state, Node.failure_reason).where(
            Node.kind == HOST
        )
        with self.engine.connect() as conn:
            return {uuid: (state, why) for uuid, state, why in conn.execute(query)}

    def verdict_counts(self) -> dict[str, int]:
        """Hosts by verdict: ``trusted``, ``untrusted`` and ``unknown``."""
        query = sa.select(Host.trusted, sa.func.count()).group_by(Host.trusted)
        names = {True: "trusted", False: "untrusted", None: "unknown"}
        with self.engine.connect() as conn:
            return {names[trusted]: count for trusted, count in conn.execute(query)}

    def by_name(self) -> dict[str, Host]:
        """Every host, by hypervisor host name."""
        return {row.hypervisor_hostname: row for row in self.all()}

    def delete(self, uuid: str) -> bool:
        """Forget host ``uuid`` and its node row (its events stay)."""
        with self.engine.begin() as conn:
            gone = conn.execute(sa.delete(Host).where(Host.uuid == uuid))
            conn.execute(sa.delete(Node).where(Node.uuid == uuid, Node.kind == HOST))
        return gone.rowcount == 1

    def set_verdict(self, uuid: str, trusted: bool | None, at: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(Host)
                .where(Host.uuid == uuid)
                .values(trusted=trusted, verdict_at=at)
            )

    def set_ca(self, uuid: str, digest: str) -> None:
        """Record the CA digest host ``uuid``'s attested IMA list proved."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(Host).where(Host.uuid == uuid).values(ca_sha256=digest)
            )

    def set_round(self, uuid: str, round_json: str) -> None:
        """Keep host ``uuid``'s latest passing host round."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(Host).where(Host.uuid == uuid).values(last_round=round_json)
            )

    def guests_of(self, name: str) -> list[GuestRef]:
        """The guests whose current host is ``name``."""
        query = (
            sa.select(Node.uuid, Node.project_id)
            .where(Node.compute_host == name, Node.kind == GUEST)
            .order_by(Node.uuid)
        )
        with self.engine.connect() as conn:
            return [
                GuestRef(uuid, project or "") for uuid, project in conn.execute(query)
            ]

    def hosts_of(self, uuids: list[str]) -> dict[str, str]:
        """Guest UUID -> its current host name, for those of ``uuids`` with one."""
        out: dict[str, str] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(uuids), 500):
                query = sa.select(Node.uuid, Node.compute_host).where(
                    Node.uuid.in_(uuids[i : i + 500]), Node.compute_host.is_not(None)
                )
                out.update({uuid: host for uuid, host in conn.execute(query) if host})
        return out

    def placements(self) -> dict[str, str]:
        """Guest UUID -> its current host name, of every guest with one."""
        query = sa.select(Node.uuid, Node.compute_host).where(
            Node.kind == GUEST, Node.compute_host.is_not(None)
        )
        with self.engine.connect() as conn:
            return {uuid: host for uuid, host in conn.execute(query) if host}

    def place(self, uuid: str, name: str) -> bool:
        """Guest ``uuid`` now runs on host ``name``.

        Returns: False if no such guest is enrolled.
        """
        with self.engine.begin() as conn:
            result = conn.execute(
                sa.update(Node)
                .where(Node.uuid == uuid, Node.kind == GUEST)
                .values(compute_host=name, updated_at=self._clock())
            )
        return result.rowcount == 1
