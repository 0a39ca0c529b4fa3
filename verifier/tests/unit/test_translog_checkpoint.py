"""Signed checkpoints of the attestation log (C2SP signed-note and
tlog-checkpoint), checked against the published reference note."""

from __future__ import annotations

import base64
import hashlib
import random

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.protocol.errors import MalformedError
from verifier.protocol.translog import (
    Checkpoint,
    LogProofError,
    key_hash,
    log_origin,
    open_checkpoint,
    sign_checkpoint,
    verifier_key,
)
from verifier.protocol.translog.checkpoint import _split_note

KEY = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
ORIGIN = log_origin(KEY.public_key())
CP = Checkpoint(ORIGIN, 1234, hashlib.sha256(b"root").digest())

# The signed-note reference example (golang.org/x/mod/sumdb/note): its key,
# as a verifier key and as the 0x01-prefixed Ed25519 seed, the text and the
# note's signature line.
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SEED = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_SIG = (
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2"
    "pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)
# The example checkpoint of the C2SP tlog-checkpoint specification.
C2SP_NOTE = (
    "example.com/behind-the-sofa\n20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n"
    "\u2014 example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeO"
    "oRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)


class ReferenceTest(testtools.TestCase):
    def test_key_hash_and_signature_match_the_reference_note(self) -> None:
        seed = base64.b64decode(GO_SEED)
        self.assertEqual(b"\x01", seed[:1])
        key = ed25519.Ed25519PrivateKey.from_private_bytes(seed[1:])
        self.assertEqual(GO_VKEY, verifier_key("PeterNeumann", key.public_key()))
        self.assertEqual("c74f20a3", key_hash("PeterNeumann", key.public_key()).hex())
        text, lines = _split_note(GO_TEXT + "\n" + GO_SIG)
        self.assertEqual(GO_TEXT, text)
        [(name, raw)] = lines
        self.assertEqual("PeterNeumann", name)
        self.assertEqual(key_hash(name, key.public_key()), raw[:4])
        # Ed25519 is deterministic: signing the text again gives the same line
        self.assertEqual(raw[4:], key.sign(text.encode()))

    def test_the_c2sp_example_checkpoint_parses(self) -> None:
        text, [(name, raw)] = _split_note(C2SP_NOTE)
        cp = Checkpoint.from_body(text)
        self.assertEqual("example.com/behind-the-sofa", cp.origin)
        self.assertEqual("example.com/behind-the-sofa", name)
        self.assertEqual(20852163, cp.size)
        self.assertEqual(text.encode(), cp.body())
        self.assertEqual(4 + 64, len(raw))


class CheckpointTest(testtools.TestCase):
    def test_signed_checkpoint_opens(self) -> None:
        note = sign_checkpoint(CP, KEY, ORIGIN)
        self.assertTrue(note.startswith(CP.body().decode() + "\n\u2014 " + ORIGIN))
        self.assertEqual(CP, open_checkpoint(note, KEY.public_key(), ORIGIN))
        self.assertEqual(
            CP, open_checkpoint(note.encode(), KEY.public_key(), ORIGIN, ORIGIN)
        )

    def test_log_origin_names_the_key(self) -> None:
        raw = bytes(KEY.public_key().public_bytes_raw())
        self.assertEqual(
            "trusted-cloud.attestation/" + hashlib.sha256(raw).hexdigest()[:16],
            ORIGIN,
        )

    def test_other_signers_lines_are_ignored(self) -> None:
        other = ed25519.Ed25519PrivateKey.generate()
        theirs = sign_checkpoint(CP, other, "witness.example/w1")
        ours = sign_checkpoint(CP, KEY, ORIGIN)
        both = ours + theirs.split("\n\n", 1)[1]
        self.assertEqual(CP, open_checkpoint(both, KEY.public_key(), ORIGIN))
        first_theirs = theirs + ours.split("\n\n", 1)[1]
        self.assertEqual(CP, open_checkpoint(first_theirs, KEY.public_key(), ORIGIN))

    def test_checkpoint_signed_by_another_key_is_refused(self) -> None:
        other = ed25519.Ed25519PrivateKey.generate()
        note = sign_checkpoint(CP, other, ORIGIN)  # same name, another key
        error = self.assertRaises(
            LogProofError, open_checkpoint, note, KEY.public_key(), ORIGIN
        )
        self.assertEqual("unknown_key", error.reason)
        note = sign_checkpoint(CP, KEY, "someone-else")
        error = self.assertRaises(
            LogProofError, open_checkpoint, note, KEY.public_key(), ORIGIN
        )
        self.assertEqual("unknown_key", error.reason)

    def test_forged_checkpoint_is_refused(self) -> None:
        note = sign_checkpoint(CP, KEY, ORIGIN)
        forged = note.replace("\n1234\n", "\n1235\n")
        error = self.assertRaises(
            LogProofError, open_checkpoint, forged, KEY.public_key(), ORIGIN
        )
        self.assertEqual("bad_signature", error.reason)
        # a valid line of ours with a corrupted signature after it: refused
        head, line = note.split("\n\n")
        name, sig = line[2:-1].split(" ")
        raw = bytearray(base64.b64decode(sig))
        raw[-1] ^= 1
        bad = f"{head}\n\n\u2014 {name} {base64.b64encode(raw).decode()}\n"
        error = self.assertRaises(
            LogProofError, open_checkpoint, bad, KEY.public_key(), ORIGIN
        )
        self.assertEqual("bad_signature", error.reason)

    def test_checkpoint_of_another_log_is_refused(self) -> None:
        cp = Checkpoint("another.log/x", 5, CP.root)
        note = sign_checkpoint(cp, KEY, ORIGIN)
        self.assertEqual(cp, open_checkpoint(note, KEY.public_key(), ORIGIN))
        error = self.assertRaises(
            LogProofError, open_checkpoint, note, KEY.public_key(), ORIGIN, ORIGIN
        )
        self.assertEqual("wrong_origin", error.reason)

    def test_extension_lines_are_signed_and_ignored(self) -> None:
        body = CP.body() + b"extension line\n"
        sig = KEY.sign(body)
        khash = key_hash(ORIGIN, KEY.public_key())
        line = base64.b64encode(khash + sig).decode()
        note = body.decode() + f"\n\u2014 {ORIGIN} {line}\n"
        self.assertEqual(CP, open_checkpoint(note, KEY.public_key(), ORIGIN))

    def test_invalid_checkpoints_and_names_are_refused(self) -> None:
        for origin, size, root in (
            ("", 1, CP.root),
            ("a\nb", 1, CP.root),
            ("a", -1, CP.root),
            ("a", 2**63, CP.root),
            ("a", True, CP.root),
            ("a", 1, b"short"),
        ):
            self.assertRaises(MalformedError, Checkpoint, origin, size, root)
        for name in ("", "a b", "a+b", "a\tb", "a\u2003b"):
            self.assertRaises(MalformedError, sign_checkpoint, CP, KEY, name)

    def test_malformed_notes_are_refused(self) -> None:
        note = sign_checkpoint(CP, KEY, ORIGIN)
        head, line = note.split("\n\n")
        for bad in (
            "",
            head,
            head + "\n\n",
            note[:-1],
            note.replace("\u2014", "-"),
            note.replace("\n1234\n", "\n01234\n"),
            note.replace("\n1234\n", "\n-1\n"),
            note.replace("\n1234\n", "\n\n"),
            head + "\x00\n\n" + line,
            head + "\n\n" + line + line.replace(ORIGIN, "a b"),
            head + "\n\n" + "\u2014 x AAAA\n",
            head + "\n\n" + "\u2014 x !!!!\n",
            head + "\n\n" + line * 101,
            b"\xff" + note.encode(),
            "x" * 70000,
        ):
            self.assertRaises(
                (MalformedError, LogProofError),
                open_checkpoint,
                bad,
                KEY.public_key(),
                ORIGIN,
            )
        # 100 lines are fine
        self.assertEqual(
            CP, open_checkpoint(head + "\n\n" + line * 100, KEY.public_key(), ORIGIN)
        )

    def test_random_notes_raise_only_protocol_errors(self) -> None:
        rng = random.Random(7)
        note = sign_checkpoint(CP, KEY, ORIGIN).encode()
        for _ in range(2000):
            kind = rng.randrange(3)
            if kind == 0:
                data = rng.randbytes(rng.randrange(200))
            elif kind == 1:
                data = note[: rng.randrange(len(note))]
            else:
                mutable = bytearray(note)
                mutable[rng.randrange(len(mutable))] = rng.randrange(256)
                data = bytes(mutable)
            try:
                open_checkpoint(data, KEY.public_key(), ORIGIN)
            except (MalformedError, LogProofError):
                pass
