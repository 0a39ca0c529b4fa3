"""``trusted-tenant history --verify``: the tenant's offline check of a
node's history against a checkpoint it kept (no network), its table and
summary, and its refusals: exit 1 naming why for a proof that does not
verify, exit 2 for bad input."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import tempfile
import unittest
import uuid as uuid_mod
from typing import Any
from unittest import mock

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.orm import Session

from nova_plugin import cmd
from nova_plugin.loghistory import HistoryRefusedError, verify_saved
from verifier.db import make_engine, upgrade
from verifier.tlog import ATTESTED, REVOKED, UNREACHABLE, stage
from verifier.tlog.reads import LogReader
from verifier.tlog.sequencer import LogSequencer

NODE = str(uuid_mod.UUID(int=7))
OTHER = str(uuid_mod.UUID(int=8))


def _pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


class HistoryCase(unittest.TestCase):
    """A log with node NODE's history and a checkpoint kept before its
    last two entries (no tests)."""

    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.engine = make_engine("sqlite:///" + os.path.join(self.dir, "v.db"))
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.sequencer = LogSequencer(self.engine, self.key, lambda: 1_700_000_000.0)
        self.reader = LogReader(self.engine)
        self.stage(NODE, ATTESTED)
        self.stage(OTHER, ATTESTED)
        self.sequencer.sequence_all()
        self.kept = self.write("kept.note", self.reader.checkpoint())
        self.stage(NODE, UNREACHABLE, "unreachable", "missed 5 rounds")
        self.stage(NODE, REVOKED, "pcr_policy", "PCR 16 changed")
        self.sequencer.sequence_all()
        self.key_file = self.write("event.pem", _pem(self.key).decode())

    def stage(self, node: str, kind: str, reason: str = "", detail: str = "") -> None:
        with Session(self.engine) as session, session.begin():
            stage(session, kind, node, "p1", reason or kind, detail, 1_700_000_000.0)

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def saved(self) -> dict[str, Any]:
        history = self.reader.history(NODE, None).to_dict()
        proof = self.reader.consistency(2, history["tree_size"])
        return {
            "history": history,
            "consistency": {
                "from": 2,
                "to": history["tree_size"],
                "proof": [base64.b64encode(p).decode() for p in proof],
            },
            "until": False,
        }


class HistoryCliTest(HistoryCase):
    def run_cli(self, saved: Any, *extra: str) -> tuple[int, str, str]:
        path = self.write("history.json", json.dumps(saved))
        argv = ["history", "--verify", path, *extra]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cmd.main(argv)
        return status, out.getvalue(), err.getvalue()

    def verify(self, saved: Any) -> tuple[int, str, str]:
        return self.run_cli(saved, "--checkpoint", self.kept, "--key", self.key_file)

    def test_history_verifies_offline_against_the_kept_checkpoint(self) -> None:
        status, out, err = self.verify(self.saved())
        self.assertEqual(0, status, err)
        lines = out.splitlines()
        self.assertIn("attested", lines[1])
        self.assertIn("PCR 16 changed", lines[3])
        self.assertEqual(
            "verified: 3 entries included in tree of size 4, consistent with "
            "your checkpoint of size 2",
            lines[-1],
        )

    def test_rewritten_entry_is_refused(self) -> None:
        saved = self.saved()
        saved["history"]["entries"][2]["entry"]["reason"] = "tenant_revoked"
        status, _, err = self.verify(saved)
        self.assertEqual(1, status)
        self.assertIn("root_mismatch", err)

    def test_removed_entry_is_refused(self) -> None:
        saved = self.saved()
        del saved["history"]["entries"][1]
        status, _, err = self.verify(saved)
        self.assertEqual(1, status)
        self.assertIn("missing_entry", err)

    def test_dropped_last_entry_is_refused(self) -> None:
        saved = self.saved()
        del saved["history"]["entries"][2]
        status, _, err = self.verify(saved)
        self.assertEqual(1, status)
        self.assertIn("missing_entry", err)

    def test_checkpoint_signed_by_another_key_is_refused(self) -> None:
        other = self.write(
            "other.pem", _pem(ed25519.Ed25519PrivateKey.generate()).decode()
        )
        status, _, err = self.run_cli(
            self.saved(), "--checkpoint", self.kept, "--key", other
        )
        self.assertEqual(1, status)
        self.assertIn("unknown_key", err)

    def test_forged_consistency_proof_is_refused(self) -> None:
        saved = self.saved()
        saved["consistency"]["proof"] = [base64.b64encode(bytes(32)).decode()]
        status, _, err = self.verify(saved)
        self.assertEqual(1, status)
        self.assertIn("forked", err)

    def test_bad_input_is_exit_2(self) -> None:
        for saved, extra in (
            ({"nothing": 1}, ("--checkpoint", self.kept, "--key", self.key_file)),
            ([1, 2], ("--checkpoint", self.kept, "--key", self.key_file)),
            (self.saved(), ("--key", self.key_file)),
            (self.saved(), ("--checkpoint", self.kept, "--key", self.kept)),
            (self.saved(), ("--checkpoint", "/nonexistent", "--key", self.key_file)),
        ):
            with self.subTest(extra=extra):
                status, _, err = self.run_cli(saved, *extra)
                self.assertEqual(2, status, err)
                self.assertEqual(1, len(err.splitlines()), err)


class _FakeAttestation:
    """The verifier's log API as :class:`AttestationClient` answers it."""

    def __init__(self, reader: LogReader, pem: str) -> None:
        self._reader, self._pem = reader, pem

    def history(self, uuid: str, since: Any = None, until: Any = None) -> Any:
        return json.loads(json.dumps(self._reader.history(uuid, None).to_dict()))

    def log_checkpoint(self) -> dict[str, str]:
        return {"checkpoint": self._reader.checkpoint(), "key": self._pem}

    def log_consistency(self, old: int, new: int) -> dict[str, Any]:
        proof = self._reader.consistency(old, new)
        return {
            "from": old,
            "to": new,
            "proof": [base64.b64encode(p).decode() for p in proof],
        }


class OscHistoryTest(HistoryCase):
    """``openstack attestation node history``, online then offline."""

    def osc(self, *argv: str) -> tuple[Any, str]:
        from osc_lib import exceptions as osc_exceptions

        from nova_plugin.osc_history import NodeHistory

        app = mock.Mock()
        app.stderr = io.StringIO()
        app.client_manager.attestation = _FakeAttestation(
            self.reader, _pem(self.key).decode()
        )
        command = NodeHistory(app, None)
        args = command.get_parser("history").parse_args(list(argv))
        try:
            return command.take_action(args), app.stderr.getvalue()
        except osc_exceptions.CommandError as exc:
            return None, str(exc)

    def test_osc_history_online_then_offline(self) -> None:
        out = os.path.join(self.dir, "saved.json")
        result, said = self.osc(NODE, "--checkpoint", self.kept, "--output", out)
        columns, rows = result
        self.assertEqual(("time", "kind", "reason", "detail"), columns)
        self.assertEqual(["attested", "unreachable", "revoked"], [r[1] for r in rows])
        self.assertIn("consistent with your checkpoint of size 2", said)
        args = ("--verify", out, "--checkpoint", self.kept, "--key", self.key_file)
        result, said = self.osc(*args)
        self.assertEqual(3, len(result[1]))
        with open(out, encoding="utf-8") as handle:
            saved = json.load(handle)
        saved["history"]["entries"][0]["entry"]["detail"] = "forged"
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(saved, handle)
        result, said = self.osc(*args)
        self.assertIsNone(result)
        self.assertIn("root_mismatch", said)


class ShrunkLogTest(HistoryCase):
    def test_tree_smaller_than_the_kept_checkpoint_is_refused_as_forked(self) -> None:
        served = self.reader.history(NODE, None).to_dict()  # size 4
        self.stage(NODE, ATTESTED)
        self.sequencer.sequence_all()
        bigger = self.reader.checkpoint()  # size 5, kept by the tenant
        # what the CLIs save when the tree served is smaller than the kept one
        saved = {
            "history": served,
            "consistency": {"from": 5, "to": 4, "proof": []},
            "until": False,
        }
        with self.assertRaises(HistoryRefusedError) as ctx:
            verify_saved(saved, self.key.public_key(), bigger)
        self.assertEqual("forked", ctx.exception.reason)
