"""A node's history in the attestation log, checked offline: one named test
per attack on the log, and the entry parsers on garbage."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.protocol.errors import MalformedError
from verifier.protocol.translog import (
    Checkpoint,
    EntryKind,
    Frontier,
    HistoryProof,
    LogEntry,
    LogProofError,
    consistency_proof,
    inclusion_proof,
    log_origin,
    open_checkpoint,
    sign_checkpoint,
    verify_extension,
    verify_history,
)

KEY = ed25519.Ed25519PrivateKey.from_private_bytes(b"\x07" * 32)
ORIGIN = log_origin(KEY.public_key())
NODE = str(uuid.UUID(int=1))
OTHER = str(uuid.UUID(int=2))
KINDS = [EntryKind.ATTESTED, EntryKind.UNREACHABLE, EntryKind.RECOVERED]


class Log:
    """A log as the storage keeps it: entries, nodes, a frontier."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.frontier = Frontier()
        self.last: dict[str, int] = {}

    def get(self, level: int, index: int) -> bytes:
        return self.nodes[(level, index)]

    def add(self, node: str, kind: EntryKind, reason: str = "ok") -> LogEntry:
        entry = LogEntry(
            index=self.frontier.size,
            prev=self.last.get(node),
            node_uuid=node,
            project_id="p1",
            kind=kind,
            reason=reason,
            detail=f"{kind.value} {node[-4:]}",
            created_at=1_700_000_000.0 + self.frontier.size,
            event_id=str(uuid.UUID(int=1000 + self.frontier.size)),
        )
        for level, index, digest in self.frontier.append(entry.leaf()):
            self.nodes[(level, index)] = digest
        self.entries.append(entry)
        self.last[node] = entry.index
        return entry

    def checkpoint(self) -> Checkpoint:
        note = sign_checkpoint(
            Checkpoint(ORIGIN, self.frontier.size, self.frontier.root()), KEY, ORIGIN
        )
        return open_checkpoint(note, KEY.public_key(), ORIGIN, ORIGIN)

    def history(self, node: str, size: int | None = None) -> list[HistoryProof]:
        size = self.frontier.size if size is None else size
        return [
            HistoryProof(e, tuple(inclusion_proof(e.index, size, self.get)))
            for e in self.entries[:size]
            if e.node_uuid == node
        ]


def _log() -> Log:
    log = Log()
    for i in range(30):
        log.add(NODE if i % 3 == 0 else OTHER, KINDS[i % len(KINDS)])
    return log


class HistoryTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.log = _log()
        self.cp = self.log.checkpoint()
        self.items = self.log.history(NODE)

    def _refused(self, reason: str, items: list[HistoryProof], **kw: object) -> None:
        error = self.assertRaises(
            LogProofError, verify_history, NODE, items, self.cp, **kw
        )
        self.assertEqual(reason, error.reason, str(error))

    def test_whole_history_verifies(self) -> None:
        entries = verify_history(NODE, self.items, self.cp, last=27)
        self.assertEqual(list(range(0, 30, 3)), [e.index for e in entries])
        self.assertEqual([], verify_history(NODE, [], self.cp))

    def test_history_travels_as_json(self) -> None:
        wire = json.loads(json.dumps([item.to_dict() for item in self.items]))
        items = [HistoryProof.from_dict(d) for d in wire]
        self.assertEqual(self.items, items)
        self.assertEqual(
            self.items[0].entry.to_bytes(),
            json.dumps(
                wire[0]["entry"], sort_keys=True, separators=(",", ":")
            ).encode(),
        )

    def test_removed_entry_breaks_history(self) -> None:
        self._refused("missing_entry", self.items[:4] + self.items[5:])
        self._refused("missing_entry", self.items[1:])

    def test_reordered_entries_are_refused(self) -> None:
        items = list(self.items)
        items[3], items[4] = items[4], items[3]
        self._refused("out_of_order", items)
        self._refused("out_of_order", self.items[:3] + self.items[2:])

    def test_rewritten_entry_fails_inclusion(self) -> None:
        item = self.items[4]
        for change in (
            {
                "kind": EntryKind.ATTESTED
                if item.entry.kind != EntryKind.ATTESTED
                else EntryKind.REVOKED
            },
            {"reason": "rewritten"},
            {"detail": ""},
            {"created_at": item.entry.created_at + 1},
            {"project_id": "p2"},
            {"event_id": None},
        ):
            rewritten = dataclasses.replace(item.entry, **change)
            items = list(self.items)
            items[4] = HistoryProof(rewritten, item.proof)
            self._refused("root_mismatch", items)

    def test_proof_for_another_tree_is_refused(self) -> None:
        old = self.log.history(NODE, size=20)
        self._refused("root_mismatch", old[:-1] + [self.items[len(old) - 1]])
        self._refused("bad_proof_length", self.log.history(NODE, size=16))
        other = Log()
        for i in range(30):
            other.add(NODE if i % 3 == 0 else OTHER, KINDS[i % 3], reason="other")
        theirs = other.history(NODE)
        self._refused("root_mismatch", self.items[:2] + theirs[2:])

    def test_truncated_proof_is_refused(self) -> None:
        items = list(self.items)
        items[2] = HistoryProof(items[2].entry, items[2].proof[:-1])
        self._refused("bad_proof_length", items)
        items[2] = HistoryProof(items[2].entry, ())
        self._refused("bad_proof_length", items)

    def test_dropped_last_entry_is_caught(self) -> None:
        self._refused("missing_entry", self.items[:-1], last=27)
        self._refused("missing_entry", [], last=27)
        # without the log's word on the last entry nothing can tell
        verify_history(NODE, self.items[:-1], self.cp)
        # ... until the node's next entry is shown: its prev names the gap
        self.log.add(NODE, EntryKind.REVOKED)
        self.cp = self.log.checkpoint()
        items = self.log.history(NODE)
        self._refused("missing_entry", items[:-2] + items[-1:])

    def test_entry_of_another_node_is_refused(self) -> None:
        theirs = self.log.history(OTHER)
        self._refused("wrong_node", self.items[:2] + theirs[:1])
        error = self.assertRaises(
            LogProofError, verify_history, OTHER, self.items, self.cp
        )
        self.assertEqual("wrong_node", error.reason)

    def test_entry_beyond_the_checkpoint_is_refused(self) -> None:
        old = self.log.history(NODE, size=20)
        self.cp = Checkpoint(ORIGIN, 20, Frontier.at(20, self.log.get).root())
        verify_history(NODE, old, self.cp, last=18)
        self._refused("index_out_of_range", self.items)

    def test_history_from_a_leaf_on(self) -> None:
        # pruned before leaf 10: the first entry kept (12) follows 9
        verify_history(NODE, self.items[4:], self.cp, complete_from=10)
        verify_history(NODE, self.items[4:], self.cp, complete_from=12)
        self._refused("missing_entry", self.items[4:], complete_from=9)
        self._refused("missing_entry", self.items[5:], complete_from=10)

    def test_forked_checkpoint_is_refused(self) -> None:
        kept = Checkpoint(ORIGIN, 20, Frontier.at(20, self.log.get).root())
        verify_extension(kept, self.cp, consistency_proof(20, 30, self.log.get))
        # the log rewrites entry 12 and everything after it
        forked = Log()
        for entry in self.log.entries:
            node = entry.node_uuid
            forked.add(node, entry.kind, "rewritten" if entry.index >= 12 else "ok")
        fork = forked.checkpoint()
        for proof in (
            consistency_proof(20, 30, forked.get),
            consistency_proof(20, 30, self.log.get),
        ):
            error = self.assertRaises(
                LogProofError, verify_extension, kept, fork, proof
            )
            self.assertEqual("forked", error.reason)
        same_size = Checkpoint(ORIGIN, 20, Frontier.at(20, forked.get).root())
        error = self.assertRaises(LogProofError, verify_extension, kept, same_size, [])
        self.assertEqual("forked", error.reason)
        error = self.assertRaises(LogProofError, verify_extension, self.cp, kept, [])
        self.assertEqual("forked", error.reason)

    def test_rolled_back_checkpoint_is_refused(self) -> None:
        # the log shows an older (or truncated) tree than one already seen
        older = Checkpoint(ORIGIN, 20, Frontier.at(20, self.log.get).root())
        error = self.assertRaises(
            LogProofError,
            verify_extension,
            self.cp,
            older,
            consistency_proof(20, 30, self.log.get),
        )
        self.assertEqual("forked", error.reason)

    def test_entry_moved_to_another_index_fails_inclusion(self) -> None:
        # the entry of leaf 27 claimed at leaf 28 (another node's), with the
        # genuine proof of leaf 28: the index is part of the hashed entry
        item = self.items[-1]
        moved = dataclasses.replace(item.entry, index=28)
        proof = tuple(inclusion_proof(28, 30, self.log.get))
        self._refused("root_mismatch", [*self.items[:-1], HistoryProof(moved, proof)])

    def test_checkpoint_of_another_log_does_not_extend(self) -> None:
        kept = Checkpoint(ORIGIN, 20, Frontier.at(20, self.log.get).root())
        other = Checkpoint("another/log", 30, self.cp.root)
        error = self.assertRaises(
            LogProofError,
            verify_extension,
            kept,
            other,
            consistency_proof(20, 30, self.log.get),
        )
        self.assertEqual("wrong_origin", error.reason)


def _entry_dict() -> dict[str, object]:
    return _log().entries[3].to_dict()


class EntryParsingTest(testtools.TestCase):
    def test_entry_round_trips_canonically(self) -> None:
        entry = _log().entries[3]
        data = entry.to_bytes()
        self.assertEqual(entry, LogEntry.from_bytes(data))
        self.assertNotIn(b", ", data)
        self.assertNotIn(b": ", data)
        self.assertEqual(sorted(entry.to_dict()), list(json.loads(data)))
        self.assertRaises(
            MalformedError, LogEntry.from_bytes, data.replace(b",", b", ")
        )

    def test_integer_time_is_the_same_entry(self) -> None:
        data = _entry_dict()
        data["created_at"] = 1_700_000_000
        a = LogEntry.from_dict(data)
        data["created_at"] = 1_700_000_000.0
        self.assertEqual(a.to_bytes(), LogEntry.from_dict(data).to_bytes())

    def test_bad_fields_are_refused(self) -> None:
        for field, value in (
            ("index", -1),
            ("index", 2**63),
            ("index", True),
            ("index", 1.0),
            ("prev", 3),
            ("prev", 4),
            ("prev", -1),
            ("prev", "1"),
            ("node_uuid", "ABCDEF00-0000-0000-0000-000000000001"),
            ("node_uuid", "node"),
            ("node_uuid", None),
            ("project_id", None),
            ("project_id", "p" * 256),
            ("kind", "deleted"),
            ("kind", None),
            ("kind", ["attested"]),
            ("reason", 1),
            ("detail", "d" * 8193),
            ("created_at", -1.0),
            ("created_at", "now"),
            ("created_at", None),
            ("created_at", False),
            ("event_id", "x"),
            ("event_id", 1),
        ):
            data = _entry_dict()
            data["index"] = 3
            data[field] = value
            self.assertRaises(MalformedError, LogEntry.from_dict, data)
        data = _entry_dict()
        del data["reason"]
        self.assertRaises(MalformedError, LogEntry.from_dict, data)
        data = _entry_dict()
        data["next"] = 5
        self.assertRaises(MalformedError, LogEntry.from_dict, data)
        self.assertRaises(MalformedError, LogEntry.from_bytes, b'{"created_at":NaN}')

    def test_parsers_on_garbage_raise_only_malformed(self) -> None:
        rng = random.Random(11)
        good = _log().entries[3].to_bytes()
        proof = HistoryProof(_log().entries[3], (b"\x00" * 32,)).to_dict()
        values: list[object] = [None, True, 0, -1, 2**70, 1.5, "", "x", [], {}, [1]]
        for _ in range(3000):
            choice = rng.randrange(5)
            if choice == 0:
                data = rng.randbytes(rng.randrange(120))
            elif choice == 1:
                data = good[: rng.randrange(len(good))]
            else:
                mutable = bytearray(good)
                mutable[rng.randrange(len(mutable))] = rng.randrange(256)
                data = bytes(mutable)
            try:
                LogEntry.from_bytes(data)
            except MalformedError:
                pass
            wire = json.loads(json.dumps(proof))
            key = rng.choice(["entry", "proof", "extra"])
            if choice >= 3 and key == "entry":
                wire["entry"][rng.choice(sorted(wire["entry"]))] = rng.choice(values)
            elif choice >= 3 and key == "proof":
                wire["proof"] = rng.choice(
                    [*values, ["AAAA"], ["!"], [None], ["AA" * 30] * 65]
                )
            else:
                wire[key] = rng.choice(values)
            try:
                HistoryProof.from_dict(wire)
            except MalformedError:
                pass
        for bad in values:
            self.assertRaises(MalformedError, HistoryProof.from_dict, bad)
            self.assertRaises(MalformedError, LogEntry.from_dict, bad)

    def test_verify_history_refuses_what_is_not_a_history(self) -> None:
        log = _log()
        cp = log.checkpoint()
        self.assertRaises(MalformedError, verify_history, "node", [], cp)
        self.assertRaises(
            MalformedError,
            verify_history,
            NODE,
            [None],
            cp,
        )
        self.assertRaises(
            MalformedError,
            verify_history,
            NODE,
            [],
            None,
        )

    def test_bounds_and_proofs_of_the_wrong_type_are_refused(self) -> None:
        log = _log()
        cp = log.checkpoint()
        items = log.history(NODE)
        for bad in ("5", -1, 1.0, True):
            self.assertRaises(
                MalformedError, verify_history, NODE, items, cp, complete_from=bad
            )
            self.assertRaises(MalformedError, verify_history, NODE, items, cp, last=bad)
        self.assertRaises(MalformedError, verify_history, NODE, iter(items), cp)
        entry = items[0].entry
        for proof in ((b"short",), b"\x00" * 32, (None,), (b"\x00" * 32,) * 65):
            self.assertRaises(MalformedError, HistoryProof, entry, proof)
        self.assertRaises(MalformedError, HistoryProof, None, ())
        listed = HistoryProof(entry, [b"\x00" * 32])  # type: ignore[arg-type]
        self.assertEqual((b"\x00" * 32,), listed.proof)

    def test_text_that_is_not_unicode_is_refused(self) -> None:
        data = _entry_dict()
        data["detail"] = "bad \ud800 surrogate"
        self.assertRaises(MalformedError, LogEntry.from_dict, data)
        data["detail"] = "caf\u00e9 \U0001f600"
        entry = LogEntry.from_dict(data)
        self.assertEqual(entry, LogEntry.from_bytes(entry.to_bytes()))


class WindowTest(testtools.TestCase):
    def test_history_from_a_time_on_needs_its_anchor(self) -> None:
        log = _log()
        cp = log.checkpoint()
        items = log.history(NODE)
        since = items[5].entry.created_at  # the window starts at entry 15
        verify_history(NODE, items[4:], cp, since=since)
        verify_history(NODE, items[3:], cp, since=since)
        # without the anchor, a dropped first entry of the window is missed
        error = self.assertRaises(
            LogProofError, verify_history, NODE, items[5:], cp, since=since
        )
        self.assertEqual("missing_entry", error.reason)
        error = self.assertRaises(
            LogProofError, verify_history, NODE, items[6:], cp, since=since
        )
        self.assertEqual("missing_entry", error.reason)
        for bad in ("1", float("nan"), True):
            self.assertRaises(
                MalformedError, verify_history, NODE, items, cp, since=bad
            )
