"""Signed revocation events."""

import base64
import json
import uuid

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.protocol import (
    EvidenceError,
    MalformedError,
    RevocationEvent,
    SignedEvent,
)
from verifier.protocol.events import key_id


def _event(**changes: object) -> RevocationEvent:
    fields: dict[str, object] = {
        "id": str(uuid.uuid4()),
        "node_uuid": str(uuid.uuid4()),
        "reason": "pcr_policy",
        "detail": "PCR [16] not allowed by policy",
        "created_at": "2024-05-01T12:00:00Z",
    }
    fields.update(changes)
    return RevocationEvent(**fields)  # type: ignore[arg-type]


class SignedEventTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.event = _event()
        self.signed = self.event.sign(self.key)
        self.wire = json.loads(self.signed.to_json())

    def _verify_wire(self, wire: object) -> RevocationEvent:
        return SignedEvent.from_dict(wire).verify(self.key.public_key())

    def _assert_bad_signature(self, wire: object) -> None:
        exc = self.assertRaises(EvidenceError, self._verify_wire, wire)
        self.assertEqual("event_signature", exc.reason)

    def test_round_trip(self) -> None:
        self.assertEqual(self.event, self._verify_wire(self.wire))
        self.assertEqual(self.event, self.signed.verify(self.key.public_key()))
        self.assertEqual(self.wire, self.signed.to_dict())

    def test_wire_form(self) -> None:
        self.assertEqual({"event", "signature", "key_id"}, set(self.wire))
        self.assertEqual(key_id(self.key.public_key()), self.wire["key_id"])
        self.assertEqual(64, len(base64.b64decode(self.wire["signature"])))
        self.assertEqual("node.revoked", self.wire["event"]["type"])
        self.assertEqual(1, self.wire["event"]["version"])

    def test_canonical_bytes(self) -> None:
        body = self.event.canonical_bytes()
        self.assertNotIn(b" ", body.replace(b"PCR [16] not allowed by policy", b""))
        parsed = json.loads(body)
        self.assertEqual(sorted(parsed), list(parsed))
        self.assertEqual(self.event, RevocationEvent.from_dict(parsed))

    def test_key_id_is_sha256_of_raw_public_key(self) -> None:
        import hashlib

        from cryptography.hazmat.primitives import serialization

        raw = self.key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.assertEqual(hashlib.sha256(raw).hexdigest(), self.signed.key_id)

    def test_modified_field_fails(self) -> None:
        for field, value in (
            ("reason", "operator"),
            ("detail", "nothing happened"),
            ("node_uuid", str(uuid.uuid4())),
            ("id", str(uuid.uuid4())),
            ("created_at", "2030-01-01T00:00:00Z"),
            ("type", "node.failed"),
        ):
            wire = json.loads(json.dumps(self.wire))
            wire["event"][field] = value
            self._assert_bad_signature(wire)

    def test_unknown_type_is_malformed(self) -> None:
        wire = json.loads(json.dumps(self.wire))
        wire["event"]["type"] = "node.trusted"
        self.assertRaises(MalformedError, SignedEvent.from_dict, wire)

    def test_modified_signature_fails(self) -> None:
        sig = bytearray(self.signed.signature)
        sig[0] ^= 1
        self._assert_bad_signature(
            dict(self.wire, signature=base64.b64encode(sig).decode())
        )

    def test_signature_by_another_key_fails(self) -> None:
        other = ed25519.Ed25519PrivateKey.generate()
        # Signed by the other key, honestly labelled with its key id.
        signed = self.event.sign(other)
        exc = self.assertRaises(EvidenceError, signed.verify, self.key.public_key())
        self.assertEqual("event_signature", exc.reason)
        # Signed by the other key but claiming our key id.
        forged = SignedEvent(
            self.event,
            other.sign(self.event.canonical_bytes()),
            key_id(self.key.public_key()),
        )
        exc = self.assertRaises(EvidenceError, forged.verify, self.key.public_key())
        self.assertEqual("event_signature", exc.reason)

    def test_unknown_key_id_fails(self) -> None:
        self._assert_bad_signature(dict(self.wire, key_id="00" * 32))

    def test_missing_or_extra_event_fields_are_malformed(self) -> None:
        for field in list(self.wire["event"]):
            wire = json.loads(json.dumps(self.wire))
            del wire["event"][field]
            self.assertRaises(MalformedError, SignedEvent.from_dict, wire)
        wire = json.loads(json.dumps(self.wire))
        wire["event"]["extra"] = "x"
        self.assertRaises(MalformedError, SignedEvent.from_dict, wire)

    def test_non_string_fields_are_malformed(self) -> None:
        for field in ("reason", "detail", "created_at", "type"):
            wire = json.loads(json.dumps(self.wire))
            wire["event"][field] = 5
            self.assertRaises(MalformedError, SignedEvent.from_dict, wire)

    def test_non_uuid_id_is_malformed(self) -> None:
        for field in ("id", "node_uuid"):
            wire = json.loads(json.dumps(self.wire))
            wire["event"][field] = "not-a-uuid"
            exc = self.assertRaises(MalformedError, SignedEvent.from_dict, wire)
            self.assertEqual("node UUID", exc.structure)
        self.assertRaises(MalformedError, _event, id="42")

    def test_unknown_version_is_malformed(self) -> None:
        wire = json.loads(json.dumps(self.wire))
        wire["event"]["version"] = 2
        self.assertRaises(MalformedError, SignedEvent.from_dict, wire)
        self.assertRaises(MalformedError, _event, version=2)

    def test_bad_outer_form_is_malformed(self) -> None:
        for wire in (
            None,
            [],
            "event",
            dict(self.wire, signature="not base64!"),
            dict(self.wire, key_id=None),
            dict(self.wire, event=None),
            dict(self.wire, event=[]),
        ):
            self.assertRaises(MalformedError, SignedEvent.from_dict, wire)

    def test_missing_signature_is_malformed(self) -> None:
        # SignedEvent.from_dict does base64.b64decode(str(None)): "None" is
        # valid base64, so a missing signature parses as b'6\x89\xde'.
        wire = dict(self.wire)
        del wire["signature"]
        self.assertRaises(MalformedError, SignedEvent.from_dict, wire)

    def test_non_ascii_signature_is_malformed(self) -> None:
        # b64decode raises plain ValueError for non-ASCII str input.
        wire = dict(self.wire, signature="\u00e9" * 4)
        self.assertRaises(MalformedError, SignedEvent.from_dict, wire)
