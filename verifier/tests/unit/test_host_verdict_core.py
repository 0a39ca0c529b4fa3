"""The pure meaning of a compute host's state for the trusted compute pool
(:mod:`verifier.protocol.attestation.hosts`), and a node enrolled without
V attested from its first good quote."""

from __future__ import annotations

import unittest

from verifier.protocol.attestation import NodeState
from verifier.protocol.attestation.hosts import (
    HostVerdict,
    host_trusted,
    proven_file_digest,
)
from verifier.protocol.ima.log import ImaEntry

_CA = "/var/lib/swtpm-localca/issuercert.pem"


def _entry(path: str, digest: bytes, violation: bool = False) -> ImaEntry:
    template_hash = bytes(20) if violation else b"\x01" * 20
    return ImaEntry(
        10, "ima-ng", template_hash, "sha256", digest, path, None, None, b""
    )


class HostTrustTest(unittest.TestCase):
    def test_only_an_attested_host_is_trusted(self) -> None:
        for state in NodeState:
            with self.subTest(state=state):
                expected = {NodeState.ATTESTED: True, NodeState.REVOKED: False}
                self.assertIs(expected.get(state), host_trusted(state, "pcr_policy: x"))

    def test_host_revoked_for_silence_alone_is_not_untrusted(self) -> None:
        for reason in ("unreachable", "unreachable_timeout"):
            with self.subTest(reason=reason):
                failure = f"{reason}: no answer for 900 s"
                self.assertIsNone(host_trusted(NodeState.REVOKED, failure))
                change = HostVerdict("h", "compute-1", True, None)
                self.assertFalse(change.marks_guests)
                self.assertFalse(change.trait)

    def test_host_failing_evidence_marks_its_guests_once(self) -> None:
        self.assertTrue(HostVerdict("h", "c", True, False).marks_guests)
        self.assertTrue(HostVerdict("h", "c", None, False).marks_guests)
        self.assertFalse(HostVerdict("h", "c", False, False).marks_guests)
        self.assertFalse(HostVerdict("h", "c", False, False).changed)

    def test_unreachable_host_loses_trait_and_marks_no_guest(self) -> None:
        change = HostVerdict("h", "c", True, host_trusted(NodeState.UNREACHABLE))
        self.assertTrue(change.changed)
        self.assertFalse(change.trait)
        self.assertFalse(change.marks_guests)

    def test_trait_wanted_only_while_attested(self) -> None:
        self.assertTrue(HostVerdict("h", "c", None, True).trait)
        self.assertFalse(HostVerdict("h", "c", True, False).trait)


class ProvenCaTest(unittest.TestCase):
    def test_last_measurement_of_the_ca_path_is_proven(self) -> None:
        entries = [
            _entry("boot_aggregate", b"\x00" * 32),
            _entry(_CA, b"\x0a" * 32),
            _entry("/usr/bin/qemu-system-x86_64", b"\x0b" * 32),
            _entry(_CA, b"\x0c" * 32),
        ]
        self.assertEqual(b"\x0c" * 32, proven_file_digest(entries, _CA))

    def test_ca_not_measured_proves_nothing(self) -> None:
        entries = [_entry("/usr/bin/swtpm", b"\x0b" * 32)]
        self.assertIsNone(proven_file_digest(entries, _CA))

    def test_violation_of_the_ca_path_proves_nothing(self) -> None:
        entries = [_entry(_CA, bytes(32), violation=True)]
        self.assertIsNone(proven_file_digest(entries, _CA))
