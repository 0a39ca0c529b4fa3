"""The attestation log fed by the verifier service: every verdict change
stages its entry in the same transaction, a quote that changes nothing
stages none, and the node's history verifies."""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.orm import Session

from nova_plugin.loghistory import verify_saved
from verifier.db import LogEntryRow, OutboxEvent
from verifier.tests.unit.test_attest_service import VerifierServiceBase


class LogFromServiceTest(VerifierServiceBase):
    def staged(self) -> list[tuple[str, str]]:
        with Session(self.engine) as session:
            rows = session.scalars(sa.select(LogEntryRow).order_by(LogEntryRow.id))
            return [(row.node_uuid, row.kind) for row in rows]

    async def test_each_change_is_logged_once_and_unchanged_quotes_never(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual([(agent.uuid, "attested")], self.staged())
        for _ in range(3):  # good quotes: nothing more
            await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual(1, len(self.staged()))
        agent.unreachable = True
        for _ in range(5):
            await verifier.rounds.attest_once(agent.uuid)
        agent.unreachable = False
        await verifier.rounds.attest_once(agent.uuid)
        await verifier.commands.revoke(agent.uuid, "tenant_revoked", "done")
        kinds = [kind for _, kind in self.staged()]
        self.assertEqual(["attested", "unreachable", "recovered", "revoked"], kinds)
        # the entries of signed events name them
        with Session(self.engine) as session:
            events = set(session.scalars(sa.select(OutboxEvent.id)))
            ids = set(session.scalars(sa.select(LogEntryRow.event_id)))
        self.assertEqual(events, ids - {None})

    async def test_history_of_a_revoked_node_verifies(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        await verifier.commands.revoke(agent.uuid, "tenant_revoked", "done")
        self.assertEqual(2, verifier.log_pump.pass_once())
        history = verifier.log.history(agent.uuid, None)
        saved = {"history": json.loads(json.dumps(history.to_dict()))}
        verified = verify_saved(saved, self.public_key)
        self.assertEqual(
            [("attested", "attested"), ("revoked", "tenant_revoked")],
            [(e.kind.value, e.reason) for e in verified.entries],
        )
        self.assertEqual("done", verified.entries[1].detail)
