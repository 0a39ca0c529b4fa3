"""Payload and share envelopes, and the U/V key split."""

import os
import uuid

import hypothesis
import testtools
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519
from hypothesis import strategies as st

from verifier.protocol import (
    EnvelopeError,
    MalformedError,
    canonical_uuid,
    combine,
    generate_key,
    open_payload,
    open_share,
    seal_payload,
    seal_share,
    split,
)

_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


def _raw(key: x25519.X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(*_RAW)


class CanonicalUuidTest(testtools.TestCase):
    def test_canonical_form(self) -> None:
        u = uuid.uuid4()
        self.assertEqual(str(u), canonical_uuid(str(u).upper()))
        self.assertEqual(str(u), canonical_uuid(u.hex))

    def test_not_a_uuid_is_malformed(self) -> None:
        for bad in ("", "node-1", "1234", None, "g" * 32):
            exc = self.assertRaises(MalformedError, canonical_uuid, bad)
            self.assertEqual("node UUID", exc.structure)


class PayloadEnvelopeTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.key = generate_key()
        self.node = str(uuid.uuid4())
        self.plaintext = b"tenant secret: " + os.urandom(64)
        self.envelope = seal_payload(self.key, self.plaintext, self.node)

    def test_round_trip(self) -> None:
        self.assertEqual(
            self.plaintext, open_payload(self.key, self.envelope, self.node)
        )

    def test_wire_format(self) -> None:
        self.assertEqual(b"TCP1", self.envelope[:4])
        self.assertEqual(4 + 12 + len(self.plaintext) + 16, len(self.envelope))
        self.assertNotIn(self.plaintext, self.envelope)
        again = seal_payload(self.key, self.plaintext, self.node)
        self.assertNotEqual(self.envelope[4:16], again[4:16])  # fresh nonce

    def test_empty_payload_round_trips(self) -> None:
        env = seal_payload(self.key, b"", self.node)
        self.assertEqual(b"", open_payload(self.key, env, self.node))

    def test_uuid_is_canonicalised(self) -> None:
        self.assertEqual(
            self.plaintext, open_payload(self.key, self.envelope, self.node.upper())
        )

    def test_envelope_for_another_node_uuid_is_rejected(self) -> None:
        self.assertRaises(
            EnvelopeError, open_payload, self.key, self.envelope, str(uuid.uuid4())
        )

    def test_wrong_key_is_rejected(self) -> None:
        self.assertRaises(
            EnvelopeError, open_payload, generate_key(), self.envelope, self.node
        )

    def test_tampering_is_rejected(self) -> None:
        positions = {
            "magic": 0,
            "nonce": 4,
            "ciphertext": 16,
            "tag": len(self.envelope) - 1,
        }
        for label, offset in positions.items():
            raw = bytearray(self.envelope)
            raw[offset] ^= 0x01
            exc = self.assertRaises(
                EnvelopeError, open_payload, self.key, bytes(raw), self.node
            )
            self.assertIsInstance(exc.detail, str, label)

    def test_truncated_envelope_is_rejected(self) -> None:
        for n in (0, 4, 16, 31, len(self.envelope) - 1):
            self.assertRaises(
                EnvelopeError, open_payload, self.key, self.envelope[:n], self.node
            )

    def test_share_envelope_is_not_a_payload(self) -> None:
        nk = x25519.X25519PrivateKey.generate()
        share = seal_share(_raw(nk), bytes(32), "U", self.node)
        self.assertRaises(EnvelopeError, open_payload, self.key, share, self.node)

    def test_error_does_not_leak_plaintext(self) -> None:
        exc = self.assertRaises(
            EnvelopeError, open_payload, generate_key(), self.envelope, self.node
        )
        self.assertNotIn(self.plaintext.hex(), str(exc))


class ShareEnvelopeTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.nk = x25519.X25519PrivateKey.generate()
        self.node = str(uuid.uuid4())
        self.u, self.v = split(generate_key())

    def test_u_and_v_round_trip(self) -> None:
        for kind, share in (("U", self.u), ("V", self.v)):
            env = seal_share(_raw(self.nk), share, kind, self.node)
            self.assertEqual(b"TCS1", env[:4])
            self.assertEqual(4 + 32 + 12 + 32 + 16, len(env))
            self.assertEqual(share, open_share(self.nk, env, kind, self.node))

    def test_u_envelope_opened_as_v_fails(self) -> None:
        env = seal_share(_raw(self.nk), self.u, "U", self.node)
        self.assertRaises(EnvelopeError, open_share, self.nk, env, "V", self.node)
        env = seal_share(_raw(self.nk), self.v, "V", self.node)
        self.assertRaises(EnvelopeError, open_share, self.nk, env, "U", self.node)

    def test_another_nodes_nk_fails(self) -> None:
        env = seal_share(_raw(self.nk), self.u, "U", self.node)
        other = x25519.X25519PrivateKey.generate()
        self.assertRaises(EnvelopeError, open_share, other, env, "U", self.node)

    def test_another_node_uuid_fails(self) -> None:
        env = seal_share(_raw(self.nk), self.u, "U", self.node)
        self.assertRaises(
            EnvelopeError, open_share, self.nk, env, "U", str(uuid.uuid4())
        )

    def test_tampering_is_rejected(self) -> None:
        env = seal_share(_raw(self.nk), self.u, "U", self.node)
        for offset in (0, 4, 35, 36, 48, len(env) - 1):
            raw = bytearray(env)
            raw[offset] ^= 0x01
            self.assertRaises(
                EnvelopeError, open_share, self.nk, bytes(raw), "U", self.node
            )

    def test_low_order_ephemeral_key_is_rejected(self) -> None:
        env = seal_share(_raw(self.nk), self.u, "U", self.node)
        forged = env[:4] + bytes(32) + env[36:]
        self.assertRaises(EnvelopeError, open_share, self.nk, forged, "U", self.node)

    def test_truncated_envelope_is_rejected(self) -> None:
        env = seal_share(_raw(self.nk), self.u, "U", self.node)
        for n in (0, 4, 36, 48, 63, len(env) - 1):
            self.assertRaises(
                EnvelopeError, open_share, self.nk, env[:n], "U", self.node
            )

    def test_bad_transport_key_is_malformed(self) -> None:
        for bad in (b"", bytes(31), bytes(33)):
            self.assertRaises(MalformedError, seal_share, bad, self.u, "U", self.node)

    def test_bad_kind_is_refused(self) -> None:
        self.assertRaises(ValueError, seal_share, _raw(self.nk), self.u, "K", self.node)
        env = seal_share(_raw(self.nk), self.u, "U", self.node)
        self.assertRaises(ValueError, open_share, self.nk, env, "u", self.node)


class SharesTest(testtools.TestCase):
    def test_generate_key(self) -> None:
        a, b = generate_key(), generate_key()
        self.assertEqual((32, 32), (len(a), len(b)))
        self.assertNotEqual(a, b)

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.binary(min_size=32, max_size=32))
    def test_split_combine_recovers_key(self, key: bytes) -> None:
        u, v = split(key)
        self.assertEqual((32, 32), (len(u), len(v)))
        self.assertEqual(key, combine(u, v))
        self.assertEqual(key, combine(v, u))
        self.assertEqual(v, bytes(a ^ b for a, b in zip(key, u, strict=True)))

    def test_u_alone_is_independent_of_k(self) -> None:
        key = generate_key()
        (u1, v1), (u2, v2) = split(key), split(key)
        self.assertNotEqual(u1, u2)
        self.assertNotEqual(v1, v2)
        self.assertNotEqual(key, u1)
        self.assertNotEqual(key, v1)
        # Mixing shares of two splits does not give K.
        self.assertNotEqual(key, combine(u1, v2))

    def test_u_is_not_derived_from_k(self) -> None:
        # All-zero K: if U depended on K, it would be visible here.
        u, v = split(bytes(32))
        self.assertEqual(u, v)
        self.assertNotEqual(bytes(32), u)

    def test_wrong_lengths_are_refused(self) -> None:
        for bad in (b"", bytes(16), bytes(33)):
            self.assertRaises(ValueError, split, bad)
            self.assertRaises(ValueError, combine, bad, bytes(32))
            self.assertRaises(ValueError, combine, bytes(32), bad)
