"""Plutus: key regression, lazy rotation, Merkle-signed 4 KB blocks."""

import os

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.protocol.errors import MalformedError
from verifier.protocol.merkle import (
    BLOCK,
    BlockError,
    BlockVerifier,
    Header,
    merkle_root,
    seal_object,
)
from verifier.protocol.regression import (
    KeyRegressionOwner,
    LazyFileGroup,
    ReaderState,
    RegressionError,
)

WRITER = ed25519.Ed25519PrivateKey.generate()


class KeyRegressionTest(testtools.TestCase):
    def test_newest_state_derives_every_older_key(self) -> None:
        owner = KeyRegressionOwner("fg", length=64)
        keys = [owner.key()]
        for _ in range(5):
            owner.wind()
            keys.append(owner.key())
        state = owner.reader_state()
        self.assertTrue(state.valid())
        self.assertEqual(keys, [state.key(v) for v in range(6)])
        self.assertEqual(6, len(set(keys)))

    def test_old_state_never_yields_a_newer_key(self) -> None:
        owner = KeyRegressionOwner("fg", length=64)
        revoked = owner.reader_state()
        owner.wind()
        err = self.assertRaises(RegressionError, revoked.key, 1)
        self.assertEqual("future_version", err.reason)

    def test_forged_state_does_not_validate(self) -> None:
        owner = KeyRegressionOwner("fg", length=64)
        owner.wind()
        real = owner.reader_state()
        forged = ReaderState("fg", real.version + 1, os.urandom(32), real.check)
        self.assertFalse(forged.valid())

    def test_chain_exhaustion_is_reported(self) -> None:
        owner = KeyRegressionOwner("fg", length=2)
        owner.wind()
        err = self.assertRaises(RegressionError, owner.wind)
        self.assertEqual("exhausted", err.reason)

    def test_revocation_rotates_lazily(self) -> None:
        group = LazyFileGroup(KeyRegressionOwner("fg", length=64))
        group.written("a", group.write_version())
        group.written("b", group.write_version())
        group.revoke()
        self.assertEqual(["a", "b"], group.stale())
        group.written("a", group.write_version())  # next write re-encrypts
        self.assertEqual(["b"], group.stale())
        self.assertEqual({0: 1, 1: 1}, group.histogram())


class MerkleBlockTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.owner = KeyRegressionOwner("fg", length=64)
        self.data = os.urandom(5 * BLOCK + 123)
        self.sealed = seal_object("obj", self.data, 0, self.owner.key(), WRITER)
        self.verifier = BlockVerifier(WRITER.public_key())

    def _read(self, index: int, block: bytes | None = None) -> bytes:
        s = self.sealed
        return self.verifier.read_block(
            s.header,
            index,
            s.blocks[index] if block is None else block,
            s.path(index),
            self.owner.key(s.header.version),
        )

    def test_each_block_verifies_and_decrypts_alone(self) -> None:
        got = b"".join(self._read(i) for i in range(self.sealed.header.blocks))
        self.assertEqual(self.data, got)
        self.assertEqual(6, self.sealed.header.blocks)

    def test_sizes_at_block_boundaries(self) -> None:
        for n in (0, 1, BLOCK, BLOCK + 1, 7 * BLOCK):
            data = os.urandom(n)
            s = seal_object("o", data, 0, self.owner.key(), WRITER)
            out = b"".join(
                self.verifier.read_block(
                    s.header, i, s.blocks[i], s.path(i), self.owner.key()
                )
                for i in range(s.header.blocks)
            )
            self.assertEqual(data, out)

    def test_tampered_block_is_rejected_by_its_path(self) -> None:
        bad = bytearray(self.sealed.blocks[2])
        bad[40] ^= 1
        err = self.assertRaises(BlockError, self._read, 2, bytes(bad))
        self.assertEqual("bad_path", err.reason)
        self.assertEqual(1, self.verifier.rejected["bad_path"])

    def test_block_swapped_from_another_index_is_rejected(self) -> None:
        err = self.assertRaises(BlockError, self._read, 2, self.sealed.blocks[3])
        self.assertEqual("bad_path", err.reason)

    def test_wrong_length_path_is_rejected(self) -> None:
        s = self.sealed
        err = self.assertRaises(
            BlockError, self.verifier.check_block, s.header, 1, s.blocks[1], []
        )
        self.assertEqual("bad_path", err.reason)

    def test_out_of_range_index_is_rejected(self) -> None:
        s = self.sealed
        err = self.assertRaises(
            BlockError, self.verifier.check_block, s.header, 6, s.blocks[0], []
        )
        self.assertEqual("bad_index", err.reason)

    def test_root_signed_by_another_writer_is_rejected(self) -> None:
        other = seal_object(
            "obj", self.data, 0, self.owner.key(), ed25519.Ed25519PrivateKey.generate()
        )
        err = self.assertRaises(BlockError, self.verifier.check_header, other.header)
        self.assertEqual("bad_signature", err.reason)

    def test_header_with_swapped_root_is_rejected(self) -> None:
        h = self.sealed.header
        forged = Header(
            h.obj, h.version, h.length, h.blocks, merkle_root([b"x"]), h.signature
        )
        err = self.assertRaises(BlockError, self.verifier.check_header, forged)
        self.assertEqual("bad_signature", err.reason)

    def test_revoked_reader_cannot_open_data_written_after_rotation(self) -> None:
        revoked = self.owner.reader_state()
        self.owner.wind()
        new = seal_object("obj", b"after", self.owner.version, self.owner.key(), WRITER)
        self.assertRaises(RegressionError, revoked.key, new.header.version)
        # a current reader opens both the new and the old (lazy) object
        current = self.owner.reader_state()
        self.assertEqual(self.data[:BLOCK], self._read(0))
        self.assertEqual(
            b"after",
            self.verifier.read_block(
                new.header, 0, new.blocks[0], new.path(0), current.key(1)
            ),
        )

    def test_block_opened_with_an_old_version_key_is_rejected(self) -> None:
        self.owner.wind()
        new = seal_object("obj", b"after", 1, self.owner.key(), WRITER)
        err = self.assertRaises(
            BlockError,
            self.verifier.read_block,
            new.header, 0, new.blocks[0], new.path(0), self.owner.key(0),
        )  # fmt: skip
        self.assertEqual("bad_block", err.reason)

    def test_header_round_trips_and_bad_header_is_named(self) -> None:
        h = self.sealed.header
        self.assertEqual(h, Header.from_dict(h.to_dict()))
        bad = h.to_dict()
        bad["blocks"] = 99
        err = self.assertRaises(MalformedError, Header.from_dict, bad)
        self.assertIn("inconsistent", str(err))
