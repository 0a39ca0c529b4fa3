"""The shared push store (migration 0009): push sessions and the tenant's
relay state in the verifier's database, so that a restarted verifier
process -- or another process of the deployment that takes the node over
-- honours an agent's open session and a tenant's pending identity ask
or U. The pure ledgers (:class:`~verifier.protocol.push.PushLedger`,
:class:`~verifier.protocol.relay.RelayLedger`) stay the working copy;
this module writes their changes through and reads what they miss.

Session nonces need no store: they are a MAC under a key every process
of a deployment derives from the event-signing key
(:func:`session_key`), so any process checks a nonce another gave.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy.orm import Session

from verifier.db.models import PushSession, RelayState

__all__ = ["PushStore", "session_key"]

LOG = logging.getLogger(__name__)
_INFO = b"trusted-cloud push session nonce key v1"


def session_key(signing_key: ed25519.Ed25519PrivateKey) -> bytes:
    """The push session-nonce MAC key of a deployment: derived (HKDF) from
    its event-signing key, which every verifier process holds, so nonces
    outlive a restart and any process checks another's."""
    raw = signing_key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return HKDF(hashes.SHA256(), 32, salt=None, info=_INFO).derive(raw)


class PushStore:
    """Push sessions and relay state in the verifier's database.

    Args:
        engine: the verifier's database.
        clock: wall clock (seconds).
    """

    def __init__(self, engine: sa.Engine, clock: Callable[[], float]) -> None:
        self._engine = engine
        self._clock = clock

    # -- sessions ------------------------------------------------------------

    def save_session(self, digest: bytes, uuid: str, expires_at: float) -> None:
        with Session(self._engine) as session, session.begin():
            session.merge(PushSession(
                token_digest=digest, node_uuid=uuid, expires_at=expires_at
            ))  # fmt: skip
            session.execute(
                sa.delete(PushSession).where(PushSession.expires_at < self._clock())
            )

    def find_session(self, digest: bytes) -> tuple[str, float] | None:
        """(node, expiry) of the session with this token digest, if any."""
        with Session(self._engine) as session:
            row = session.get(PushSession, digest)
            return None if row is None else (row.node_uuid, row.expires_at)

    def forget_sessions(self, uuid: str) -> None:
        with Session(self._engine) as session, session.begin():
            session.execute(sa.delete(PushSession).where(PushSession.node_uuid == uuid))

    # -- relay -----------------------------------------------------------------

    def save_relay(self, uuid: str, state: Mapping[str, Any] | None) -> None:
        """Store what the relay ledger exports of ``uuid`` (None: drop it)."""
        with Session(self._engine) as session, session.begin():
            if state is None:
                session.execute(
                    sa.delete(RelayState).where(RelayState.node_uuid == uuid)
                )
                return
            body = json.dumps(state, separators=(",", ":")).encode()
            session.merge(
                RelayState(node_uuid=uuid, body=body, updated_at=self._clock())
            )

    def relay_state(self, uuid: str) -> Any:
        """The stored relay state of ``uuid`` (None: none, or unreadable)."""
        with Session(self._engine) as session:
            row = session.get(RelayState, uuid)
            if row is None:
                return None
            try:
                return json.loads(row.body)
            except ValueError:
                LOG.warning("Relay state of node %s unreadable", uuid)
                return None

    def relay_states(self) -> dict[str, Any]:
        """Every stored relay state, by node (unreadable rows are skipped
        with a warning: their tenant times out and enrols again)."""
        out: dict[str, Any] = {}
        with Session(self._engine) as session:
            for row in session.scalars(sa.select(RelayState)):
                try:
                    out[row.node_uuid] = json.loads(row.body)
                except ValueError:
                    LOG.warning("Relay state of node %s unreadable", row.node_uuid)
        return out
