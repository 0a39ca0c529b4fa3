"""Snapdragon-style capabilities: MAC, expiry, epoch, rights, replay."""

import dataclasses
import os
import uuid

import testtools

from verifier.protocol.capability import (
    Capability,
    CapabilityChecker,
    CapabilityError,
    issue,
)
from verifier.protocol.errors import MalformedError

KEY = bytes(range(32))
NODE = str(uuid.uuid4())
NOW = 1_700_000_000


def _cap(**changes: object) -> Capability:
    fields: dict[str, object] = {
        "node": NODE,
        "obj": "luks:vol-1",
        "rights": "r",
        "expiry": NOW + 60,
        "epoch": 0,
        "nonce": os.urandom(16),
    }
    fields.update(changes)
    return issue(KEY, **fields)  # type: ignore[arg-type]


class CapabilityTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.checker = CapabilityChecker(KEY)

    def _refused(self, reason: str, token: object, right: str = "r") -> None:
        err = self.assertRaises(
            CapabilityError, self.checker.check_token, token, "luks:vol-1", right, NOW
        )
        self.assertEqual(reason, err.reason)
        self.assertEqual(1, self.checker.rejected[reason])

    def test_valid_capability_is_honoured_and_round_trips(self) -> None:
        cap = _cap()
        got = self.checker.check_token(cap.to_token(), "luks:vol-1", "r", NOW)
        self.assertEqual(cap, got)
        self.assertEqual(1, self.checker.accepted)

    def test_bad_mac_is_rejected(self) -> None:
        cap = _cap()
        forged = dataclasses.replace(cap, mac=bytes(32))
        self._refused("bad_mac", forged.to_token())

    def test_mac_under_another_key_is_rejected(self) -> None:
        cap = issue(
            os.urandom(32), NODE, "luks:vol-1", "r", NOW + 60, 0, os.urandom(16)
        )
        self._refused("bad_mac", cap.to_token())

    def test_widened_rights_break_the_mac(self) -> None:
        cap = _cap()
        widened = dataclasses.replace(cap, rights="rw")
        self._refused("bad_mac", widened.to_token(), right="w")

    def test_expired_capability_is_rejected(self) -> None:
        self._refused("expired", _cap(expiry=NOW).to_token())

    def test_old_epoch_is_rejected_after_bump(self) -> None:
        cap = _cap()
        self.assertEqual(1, self.checker.bump(NODE))
        self._refused("old_epoch", cap.to_token())

    def test_bump_leaves_other_nodes_unaffected(self) -> None:
        other = _cap(node=str(uuid.uuid4()))
        self.checker.bump(NODE)
        self.checker.check_token(other.to_token(), "luks:vol-1", "r", NOW)

    def test_newer_epoch_raises_the_floor(self) -> None:
        old = _cap(epoch=0)
        self.checker.check_token(_cap(epoch=2).to_token(), "luks:vol-1", "r", NOW)
        self.assertEqual(2, self.checker.epoch(NODE))
        self._refused("old_epoch", old.to_token())

    def test_replayed_capability_is_rejected(self) -> None:
        token = _cap().to_token()
        self.checker.check_token(token, "luks:vol-1", "r", NOW)
        self._refused("replay", token)

    def test_capability_for_another_object_is_rejected(self) -> None:
        self._refused("wrong_object", _cap(obj="luks:vol-2").to_token())

    def test_missing_right_is_rejected(self) -> None:
        self._refused("no_right", _cap(rights="r").to_token(), right="w")

    def test_garbage_token_is_rejected_as_malformed(self) -> None:
        self._refused("malformed", "not-a-token")

    def test_reencoded_body_breaks_the_mac(self) -> None:
        cap = _cap()
        body, mac = cap.to_token().split(".")
        import base64
        import json

        fields = json.loads(base64.urlsafe_b64decode(body))
        spaced = base64.urlsafe_b64encode(json.dumps(fields, indent=1).encode())
        self._refused("bad_mac", f"{spaced.decode()}.{mac}")
        self.assertRaises(
            MalformedError, Capability.from_token, f"{spaced.decode()}.{mac}"
        )

    def test_mac_valid_garbage_body_is_malformed(self) -> None:
        import base64
        import hashlib

        body = b'{"node": 1}'
        mac = hashlib.blake2b(body, key=KEY, digest_size=32, person=b"tc-cap-v1")
        enc = base64.urlsafe_b64encode
        token = f"{enc(body).decode()}.{enc(mac.digest()).decode()}"
        self._refused("malformed", token)

    def test_bad_fields_are_named(self) -> None:
        err = self.assertRaises(MalformedError, _cap, rights="rx")
        self.assertIn("rights", str(err))
        err = self.assertRaises(MalformedError, _cap, obj="a b")
        self.assertIn("object", str(err))
        self.assertRaises(MalformedError, _cap, epoch=-1)

    def test_used_nonces_are_forgotten_after_expiry(self) -> None:
        self.checker.check_token(
            _cap(expiry=NOW + 1).to_token(), "luks:vol-1", "r", NOW
        )
        later = _cap(expiry=NOW + 600).to_token()
        self.checker.check_token(later, "luks:vol-1", "r", NOW + 120)
        self.assertEqual(1, len(self.checker._seen))
