"""The attestation log shared by two verifier processes on PostgreSQL.

Both verifiers attest an emulated fleet and append to one log; a tenant
keeps a checkpoint, a node is tampered with and revoked, and the tenant
CLI verifies the node's history online through the other verifier, then
offline against the kept checkpoint. Someone who rewrites the revocation's
entry in the database is refused (named test).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from typing import Any

import sqlalchemy as sa

from nova_plugin import cmd
from trusted_testing.cluster import wait_until
from trusted_testing.shared_fleet import SharedDbFleetCase
from verifier.db import LogEntryRow, make_engine
from verifier.protocol import translog

INTERVAL = 2.0
NODES = 6


class AttestationLogTest(SharedDbFleetCase):
    NAME = "tlog"
    VERIFIERS = 2
    NODES = NODES
    INTERVAL = INTERVAL
    VERIFIER_OPTIONS = {"log_interval": 0.2}

    def size(self, index: int) -> int:
        url = self.cluster.verifier_urls[index]
        note = self._session().get(f"{url}/v1/log/checkpoint", timeout=10).text
        return int(note.splitlines()[1]) if note.count("\n") > 2 else -1

    def tenant(self, index: int, *argv: str) -> tuple[int, str, str]:
        env = self.cluster.tenant_env()
        settings = [
            "--verifier", self.cluster.verifier_urls[index],
            "--cert", env["TRUSTED_CERT"],
            "--key", env["TRUSTED_KEY"],
            "--ca", env["TRUSTED_CA"],
        ]  # fmt: skip
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cmd.main([*settings, *argv])
        return status, out.getvalue(), err.getvalue()

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def entries(self) -> list[Any]:
        engine = make_engine(self.db_url)
        try:
            with engine.connect() as conn:
                return list(
                    conn.execute(
                        sa.select(
                            LogEntryRow.leaf_index,
                            LogEntryRow.node_uuid,
                            LogEntryRow.kind,
                            LogEntryRow.body,
                        ).order_by(LogEntryRow.id)
                    )
                )
        finally:
            engine.dispose()

    def test_1_revoked_node_history_verifies_offline_against_a_kept_checkpoint(
        self,
    ) -> None:
        logged = wait_until(lambda: self.size(0) >= NODES, 60, step=0.5)
        self.assertTrue(logged, self.size(0))
        status, out, err = self.tenant(
            0, "checkpoint", "--output", self.path("kept.note"),
            "--key-output", self.path("event.pem"),
        )  # fmt: skip
        self.assertEqual(0, status, err)
        kept = self.size(0)
        victim = self.fleet.uuids[0]
        self.fleet.tamper(victim)
        grew = wait_until(
            lambda: any(
                (row.node_uuid, row.kind, row.leaf_index is not None)
                == (victim, "revoked", True)
                for row in self.entries()
            ),
            6 * INTERVAL,
            step=0.2,
        )
        self.assertTrue(grew, self.entries())
        time.sleep(INTERVAL)  # each verifier had its chance to log it again
        rows = self.entries()
        self.assertEqual(list(range(len(rows))), sorted(r.leaf_index for r in rows))
        revoked = [r for r in rows if (r.node_uuid, r.kind) == (victim, "revoked")]
        self.assertEqual(1, len(revoked))
        # online, through the other verifier, against the kept checkpoint
        status, out, err = self.tenant(
            1, "history", victim, "--checkpoint", self.path("kept.note"),
            "--key", self.path("event.pem"), "--output", self.path("saved.json"),
        )  # fmt: skip
        self.assertEqual(0, status, err)
        self.assertIn("pcr_policy", out)
        self.assertIn(f"consistent with your checkpoint of size {kept}", out)
        # offline: no verifier named at all
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cmd.main(
                [
                    "history", "--verify", self.path("saved.json"),
                    "--checkpoint", self.path("kept.note"),
                    "--key", self.path("event.pem"),
                ]
            )  # fmt: skip
        self.assertEqual(0, status, err.getvalue())
        lines = out.getvalue().splitlines()
        self.assertEqual(["attested", "revoked"], [ln.split()[1] for ln in lines[1:-1]])
        self.assertTrue(lines[-1].startswith("verified: 2 entries"), lines[-1])

    def test_2_entry_rewritten_in_the_database_is_refused(self) -> None:
        victim = self.fleet.uuids[0]
        wait_until(lambda: any(r.kind == "revoked" for r in self.entries()), 30)
        (row,) = [
            r for r in self.entries() if (r.node_uuid, r.kind) == (victim, "revoked")
        ]
        forged = json.loads(row.body)
        forged["reason"], forged["detail"] = "tenant_revoked", "decommissioned"
        body = translog.LogEntry.from_dict(forged).to_bytes()
        engine = make_engine(self.db_url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    sa.update(LogEntryRow)
                    .where(LogEntryRow.leaf_index == row.leaf_index)
                    .values(body=body)
                )
        finally:
            engine.dispose()
        status, out, err = self.tenant(0, "history", victim)
        self.assertEqual(1, status, out)
        self.assertIn("root_mismatch", err)
