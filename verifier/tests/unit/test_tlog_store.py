"""The attestation log's storage (:mod:`verifier.tlog`) on SQLite: staging,
the sequencer, retention and the reads the API serves, checked with the
pure core's verifiers and the tenant's offline check
(:mod:`nova_plugin.loghistory`), and the attacks at the storage level: an
entry row rewritten or removed in the database is refused."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import unittest
import uuid as uuid_mod
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.orm import Session

from nova_plugin.loghistory import HistoryRefusedError, verify_saved
from verifier.db import LogEntryRow, LogHead, LogNode, make_engine, upgrade
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol import translog
from verifier.tlog import ATTESTED, FAILED, REVOKED, UNREACHABLE, stage
from verifier.tlog.reads import LogReader
from verifier.tlog.sequencer import LogSequencer

NODE_A = str(uuid_mod.UUID(int=1))
NODE_B = str(uuid_mod.UUID(int=2))


class LogStoreCase(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.engine = make_engine("sqlite:///" + os.path.join(tmp.name, "v.db"))
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.now = 1_700_000_000.0
        self.sequencer = LogSequencer(self.engine, self.key, lambda: self.now)
        self.reader = LogReader(self.engine)

    def stage(self, node: str, kind: str, project: str = "p1", **kw: Any) -> None:
        with Session(self.engine) as session, session.begin():
            stage(
                session,
                kind,
                node,
                project,
                kw.get("reason", kind),
                kw.get("detail", ""),
                kw.get("at", self.now),
                kw.get("event_id"),
            )

    def checkpoint(self) -> translog.Checkpoint:
        name = translog.log_origin(self.key.public_key())
        note = self.reader.checkpoint()
        return translog.open_checkpoint(note, self.key.public_key(), name, name)

    def saved(self, node: str, **kw: Any) -> dict[str, Any]:
        history = self.reader.history(node, kw.pop("scope", None), **kw)
        return {"history": json.loads(json.dumps(history.to_dict()))}

    def fill(self) -> None:
        """A: attested, unreachable, revoked; B: attested between them."""
        self.stage(NODE_A, ATTESTED)
        self.stage(NODE_B, ATTESTED, "p2")
        self.stage(NODE_A, UNREACHABLE, detail="3 rounds")
        self.stage(NODE_A, REVOKED, reason="pcr_policy", detail="PCR 16")
        self.sequencer.sequence_all()


class SequencerTest(LogStoreCase):
    def test_entries_get_dense_indices_and_chain_per_node(self) -> None:
        self.fill()
        with Session(self.engine) as session:
            rows = list(
                session.scalars(sa.select(LogEntryRow).order_by(LogEntryRow.id))
            )
        self.assertEqual([0, 1, 2, 3], [r.leaf_index for r in rows])
        self.assertEqual([None, None, 0, 2], [r.prev_index for r in rows])
        entries = [translog.LogEntry.from_bytes(r.body or b"") for r in rows]
        self.assertEqual("PCR 16", entries[3].detail)
        self.assertEqual(translog.EntryKind.REVOKED, entries[3].kind)
        # the staged columns are gone once the body holds them
        self.assertEqual([None] * 4, [r.detail for r in rows])

    def test_checkpoint_signs_the_root_of_the_entries(self) -> None:
        self.fill()
        with Session(self.engine) as session:
            bodies = list(
                session.scalars(
                    sa.select(LogEntryRow.body).order_by(LogEntryRow.leaf_index)
                )
            )
        checkpoint = self.checkpoint()
        self.assertEqual(4, checkpoint.size)
        self.assertEqual(
            translog.root_from_leaves([b or b"" for b in bodies]),
            checkpoint.root,
        )
        self.assertEqual(translog.log_origin(self.key.public_key()), checkpoint.origin)

    def test_stored_nodes_are_every_perfect_subtree(self) -> None:
        for i in range(11):
            self.stage(NODE_A if i % 3 else NODE_B, ATTESTED)
            if i % 4 == 0:
                self.sequencer.sequence_all()  # several batches
        self.sequencer.sequence_all()
        with Session(self.engine) as session:
            stored = {(n.level, n.idx) for n in session.scalars(sa.select(LogNode))}
        expected = {(level, i) for level in range(4) for i in range(11 >> level)}
        self.assertEqual(expected, stored)

    def test_nothing_staged_changes_nothing(self) -> None:
        self.assertEqual(0, self.sequencer.sequence_all())
        self.assertEqual(0, self.checkpoint().size)

    def test_two_sequencers_share_one_log(self) -> None:
        other = LogSequencer(self.engine, self.key, lambda: self.now, batch=3)
        for i in range(40):
            self.stage(NODE_A if i % 2 else NODE_B, ATTESTED)
        errors: list[BaseException] = []

        def run(sequencer: LogSequencer) -> None:
            try:
                sequencer.sequence_all()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(s,)) for s in (self.sequencer, other)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual([], errors)
        with Session(self.engine) as session:
            indices = sorted(
                i
                for i in session.scalars(sa.select(LogEntryRow.leaf_index))
                if i is not None
            )
        self.assertEqual(list(range(40)), indices)
        self.assertEqual(40, self.checkpoint().size)
        verify_saved(self.saved(NODE_A), self.key.public_key())


class HistoryTest(LogStoreCase):
    def test_history_verifies_offline(self) -> None:
        self.fill()
        verified = verify_saved(self.saved(NODE_A), self.key.public_key())
        self.assertEqual(
            ["attested", "unreachable", "revoked"],
            [e.kind.value for e in verified.entries],
        )
        self.assertEqual(4, verified.tree_size)

    def test_another_projects_node_is_not_found(self) -> None:
        self.fill()
        with self.assertRaises(NotFoundError):
            self.reader.history(NODE_B, "p1")
        with self.assertRaises(NotFoundError):
            self.reader.history(str(uuid_mod.uuid4()), None)
        self.assertEqual(1, len(self.reader.history(NODE_B, "p2").entries))

    def test_since_starts_at_the_anchor_before_it(self) -> None:
        self.stage(NODE_A, ATTESTED, at=self.now - 200)
        self.stage(NODE_A, FAILED, at=self.now - 100)
        self.stage(NODE_A, UNREACHABLE, at=self.now)
        self.sequencer.sequence_all()
        since = self.now - 10
        saved = self.saved(NODE_A, since=since) | {"since": since}
        self.assertEqual(1, saved["history"]["complete_from"])  # the anchor's
        verified = verify_saved(saved, self.key.public_key())
        # the node's last entry before the window, then the window
        self.assertEqual(
            ["failed", "unreachable"], [e.kind.value for e in verified.entries]
        )
        later = self.now + 10
        quiet = self.saved(NODE_A, since=later) | {"since": later}
        verified = verify_saved(quiet, self.key.public_key())
        self.assertEqual(["unreachable"], [e.kind.value for e in verified.entries])

    def test_history_since_cut_after_the_anchor_is_refused(self) -> None:
        self.stage(NODE_A, ATTESTED, at=self.now - 200)
        self.stage(NODE_A, FAILED, at=self.now - 100)
        self.stage(NODE_A, UNREACHABLE, at=self.now)
        self.sequencer.sequence_all()
        since = self.now - 150
        saved = self.saved(NODE_A, since=since) | {"since": since}
        del saved["history"]["entries"][:2]  # hides the failure in the window
        with self.assertRaises(HistoryRefusedError) as ctx:
            verify_saved(saved, self.key.public_key())
        self.assertEqual("missing_entry", ctx.exception.reason)

    def test_retention_prunes_a_prefix_and_younger_proofs_still_verify(self) -> None:
        self.stage(NODE_A, ATTESTED, at=self.now - 5 * 86400)
        self.stage(NODE_B, ATTESTED, at=self.now - 4 * 86400)
        self.stage(NODE_A, UNREACHABLE, at=self.now)
        self.sequencer.sequence_all()
        self.assertEqual(2, self.sequencer.prune(self.now - 86400))
        saved = self.saved(NODE_A)
        self.assertEqual(2, saved["history"]["complete_from"])
        verified = verify_saved(saved, self.key.public_key())
        self.assertEqual([2], [e.index for e in verified.entries])
        with Session(self.engine) as session:
            pruned = session.scalars(
                sa.select(LogEntryRow.pruned).order_by(LogEntryRow.leaf_index)
            )
            self.assertEqual([True, True, False], list(pruned))

    def test_consistency_proofs_between_kept_checkpoints(self) -> None:
        self.fill()
        kept = self.checkpoint()
        self.stage(NODE_B, REVOKED)
        self.sequencer.sequence_all()
        new = self.checkpoint()
        proof = self.reader.consistency(kept.size, new.size)
        translog.verify_extension(kept, new, proof)
        with self.assertRaises(RequestError) as ctx:
            self.reader.consistency(1, new.size + 1)
        self.assertEqual("to", ctx.exception.code)
        with self.assertRaises(RequestError) as ctx:
            self.reader.consistency(3, 2)
        self.assertEqual("from", ctx.exception.code)


class StorageAttackTest(LogStoreCase):
    """What someone with write access to the database cannot hide."""

    def refusal(self, saved: dict[str, Any], kept: str | None = None) -> str:
        with self.assertRaises(HistoryRefusedError) as ctx:
            verify_saved(saved, self.key.public_key(), kept)
        return ctx.exception.reason

    def test_rewritten_entry_row_is_refused(self) -> None:
        self.fill()
        with self.engine.begin() as conn:
            body = conn.scalar(
                sa.select(LogEntryRow.body).where(LogEntryRow.leaf_index == 3)
            )
            forged = json.loads(body or b"")
            forged["reason"], forged["detail"] = "tenant_revoked", "asked for"
            conn.execute(
                sa.update(LogEntryRow)
                .where(LogEntryRow.leaf_index == 3)
                .values(body=translog.LogEntry.from_dict(forged).to_bytes())
            )
        self.assertEqual("root_mismatch", self.refusal(self.saved(NODE_A)))

    def test_removed_entry_row_is_refused(self) -> None:
        self.fill()
        with self.engine.begin() as conn:
            conn.execute(sa.delete(LogEntryRow).where(LogEntryRow.leaf_index == 2))
        self.assertEqual("missing_entry", self.refusal(self.saved(NODE_A)))

    def test_rewritten_log_forks_from_the_kept_checkpoint(self) -> None:
        self.fill()
        kept = self.reader.checkpoint()
        # rewrite everything: entries, nodes and head, as a new log
        with self.engine.begin() as conn:
            for table in (LogEntryRow, LogNode, LogHead):
                conn.execute(sa.delete(table))
        self.stage(NODE_A, ATTESTED)
        self.stage(NODE_B, ATTESTED, "p2")
        self.stage(NODE_A, ATTESTED)
        self.stage(NODE_A, ATTESTED)
        self.stage(NODE_A, ATTESTED)
        self.sequencer.sequence_all()
        saved = self.saved(NODE_A)
        size = saved["history"]["tree_size"]
        proof = self.reader.consistency(4, size)
        saved["consistency"] = {
            "from": 4,
            "to": size,
            "proof": [__import__("base64").b64encode(p).decode() for p in proof],
        }
        self.assertEqual("forked", self.refusal(saved, kept))
