"""Typed wire messages of enrolment, capabilities, share envelopes, CP-ABE,
the key service and stored policies (:mod:`verifier.protocol.messages`):
round trips and one refusal per kind of field."""

from __future__ import annotations

import base64
import os
import uuid as uuid_mod

import testtools

from verifier.common.tls import self_signed_certificate
from verifier.protocol import PcrPolicy
from verifier.protocol.abe import setup
from verifier.protocol.errors import MalformedError
from verifier.protocol.messages.abe import (
    AbeKeyDelivery,
    AbeParams,
    SealedBlobRequest,
)
from verifier.protocol.messages.capabilities import CapabilityGrant, CapabilityRequest
from verifier.protocol.messages.enrolment import EnrolmentRequest, RevokeRequest
from verifier.protocol.messages.errors import ErrorBody
from verifier.protocol.messages.keyservice import (
    FilegroupState,
    RekeyLog,
    SecretRelease,
    SecretUpload,
)
from verifier.protocol.messages.policies import PolicyUpload
from verifier.protocol.messages.shares import ShareAccepted, ShareU, ShareV
from verifier.protocol.regression import KeyRegressionOwner
from verifier.tests.unit.test_messages_registration import FieldKindsMixin

UUID = str(uuid_mod.uuid4())
POLICY = PcrPolicy({16: frozenset({bytes(32)})})
CERT = self_signed_certificate("node", ["192.0.2.7"])[1].decode()


#: a commitment to U (its value does not matter to the parser)
C = bytes(range(32))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class EnrolmentTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        for msg in (
            EnrolmentRequest(UUID, bytes(32), POLICY, u_commitment=C),
            EnrolmentRequest(
                UUID, bytes(32), PcrPolicy({}), "rt@2", None, True, u_commitment=C
            ),
            EnrolmentRequest(
                UUID, bytes(32), PcrPolicy({}), None, "mb", u_commitment=C
            ),
        ):
            self.assertEqual(msg, EnrolmentRequest.from_dict(msg.to_dict()))

    def test_minimal_body_and_canonical_uuid(self) -> None:
        data = {
            "uuid": UUID.upper(),
            "v": _b64(bytes(32)),
            "policy": POLICY.to_dict(),
            "u_commitment": _b64(C),
        }
        msg = EnrolmentRequest.from_dict(data)
        self.assertEqual(
            (UUID, False, None), (msg.uuid, msg.await_instance, msg.mb_policy)
        )
        no_policy = {
            "uuid": UUID,
            "v": _b64(bytes(32)),
            "runtime_policy": "rt",
            "u_commitment": _b64(C),
        }
        self.assertEqual(PcrPolicy({}), EnrolmentRequest.from_dict(no_policy).policy)

    def test_v_of_the_wrong_size_or_encoding_is_a_bad_field(self) -> None:
        good = EnrolmentRequest(UUID, bytes(32), POLICY, u_commitment=C).to_dict()
        for v in ("***", _b64(bytes(31)), _b64(bytes(33)), 32):
            self.assert_field("v", EnrolmentRequest.from_dict, good | {"v": v})

    def test_bad_uuid_or_policy_is_malformed(self) -> None:
        good = EnrolmentRequest(UUID, bytes(32), POLICY, u_commitment=C).to_dict()
        self.assert_content("uuid", EnrolmentRequest.from_dict, good | {"uuid": "x"})
        bad = good | {"policy": {"pcrs": {"16": ["zz"]}}}
        exc = self.assertRaises(MalformedError, EnrolmentRequest.from_dict, bad)
        self.assertEqual("malformed", exc.code)
        empty = good | {"policy": {"pcrs": {}}}
        self.assertRaises(MalformedError, EnrolmentRequest.from_dict, empty)

    def test_policy_refs_flag_and_unknown_fields_are_checked(self) -> None:
        good = EnrolmentRequest(UUID, bytes(32), POLICY, u_commitment=C).to_dict()
        for field, value in (
            ("runtime_policy", 5),
            ("mb_policy", "x" * 300),
            ("await_instance", "true"),
            ("runtime_polcy", "rt"),
        ):
            self.assert_field(field, EnrolmentRequest.from_dict, good | {field: value})

    def test_revoke_request(self) -> None:
        self.assertEqual(RevokeRequest(), RevokeRequest.from_dict({}))
        msg = RevokeRequest("")
        self.assertEqual(msg, RevokeRequest.from_dict(msg.to_dict()))
        self.assert_field("detail", RevokeRequest.from_dict, {"detail": "x" * 1001})
        self.assert_field("detail", RevokeRequest.from_dict, {"detail": 5})


class CapabilityMessagesTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        for msg in (
            CapabilityRequest("secret:luks", "r"),
            CapabilityGrant("body.mac", 1_900_000_000, 3),
        ):
            self.assertEqual(msg, type(msg).from_dict(msg.to_dict()))
        self.assertEqual("secret:luks", CapabilityRequest("secret:luks", "r").obj)

    def test_refusals(self) -> None:
        self.assert_field("rights", CapabilityRequest.from_dict, {"object": "o"})
        data = {"object": "o", "rights": "r", "x": 1}
        self.assert_field("x", CapabilityRequest.from_dict, data)
        grant = CapabilityGrant("t", 1, 0).to_dict()
        for value in (-1, True, "1"):
            data = grant | {"expiry": value}
            self.assert_field("expiry", CapabilityGrant.from_dict, data)


class ShareMessagesTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        for msg in (
            ShareU(os.urandom(96), os.urandom(100)),
            ShareU(os.urandom(96), b"", UUID),
            ShareU(os.urandom(96)),  # the node has the payload (user-data)
            ShareV(os.urandom(96)),
            ShareV(os.urandom(96), CERT),
            ShareAccepted("u", True),
        ):
            self.assertEqual(msg, type(msg).from_dict(msg.to_dict()))

    def test_payload_id_is_a_canonical_uuid(self) -> None:
        msg = ShareU.from_dict({"u": "", "payload": "", "payload_id": UUID.upper()})
        self.assertEqual(UUID, msg.payload_id)
        self.assert_content("payload_id", ShareU, b"", b"", "boot-1")
        self.assert_field("payload_id", ShareU, b"", b"", 7)

    def test_u_alone_has_no_payload_field(self) -> None:
        self.assertEqual({"u": ""}, ShareU(b"").to_dict())
        self.assertIsNone(ShareU.from_dict({"u": ""}).payload)
        self.assertIsNone(ShareU.from_dict({"u": "", "payload": None}).payload)

    def test_payload_id_without_payload_is_a_bad_field(self) -> None:
        self.assert_field("payload_id", ShareU.from_dict, {"u": "", "payload_id": UUID})

    def test_oversized_or_undecodable_share_is_a_bad_field(self) -> None:
        self.assert_field(
            "u", ShareU.from_dict, {"u": _b64(bytes(1025)), "payload": ""}
        )
        self.assert_field("v", ShareV.from_dict, {"v": "not base64!"})

    def test_identity_cert_that_is_not_a_certificate_is_refused(self) -> None:
        self.assert_content("identity_cert", ShareV, b"v", "not a certificate")
        data = {"v": "", "identity_cert": ["x"]}
        self.assert_field("identity_cert", ShareV.from_dict, data)

    def test_accepted_answer_is_checked(self) -> None:
        data = {"accepted": "w", "bootstrapped": True}
        self.assert_field("accepted", ShareAccepted.from_dict, data)
        data = {"accepted": "v", "bootstrapped": 1}
        self.assert_field("bootstrapped", ShareAccepted.from_dict, data)


class AbeMessagesTest(FieldKindsMixin, testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.pp = setup()[0]

    def test_round_trips(self) -> None:
        for msg in (
            AbeParams(self.pp, 4),
            AbeKeyDelivery(b"sealed", self.pp.to_bytes(), 0),
            SealedBlobRequest(b"blob"),
        ):
            self.assertEqual(msg, type(msg).from_dict(msg.to_dict()))

    def test_params_with_a_wrong_id_are_refused(self) -> None:
        data = AbeParams(self.pp, 4).to_dict() | {"id": "00" * 32}
        self.assert_content("id", AbeParams.from_dict, data)
        data = AbeParams(self.pp, 4).to_dict() | {"params": _b64(b"junk")}
        self.assertRaises(MalformedError, AbeParams.from_dict, data)

    def test_key_delivery_refusals(self) -> None:
        good = AbeKeyDelivery(b"k", b"p", 1).to_dict()
        self.assert_field("epoch", AbeKeyDelivery.from_dict, good | {"epoch": -1})
        self.assert_field("key", AbeKeyDelivery.from_dict, good | {"key": ""})
        self.assert_field("blob", SealedBlobRequest.from_dict, {"blob": None})


class KeyServiceMessagesTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        state = KeyRegressionOwner("fg-1").reader_state()
        for msg in (
            SecretUpload(b"luks"),
            SecretRelease(b"luks"),
            RekeyLog(3, (b"m1", b"m2")),
            RekeyLog(0, ()),
            FilegroupState.of(state),
        ):
            self.assertEqual(msg, type(msg).from_dict(msg.to_dict()))
        self.assertEqual(state, FilegroupState.of(state).reader_state())

    def test_refusals(self) -> None:
        self.assert_field("secret", SecretUpload.from_dict, {"secret": ""})
        data = {"secret": _b64(bytes(4097))}
        self.assert_field("secret", SecretRelease.from_dict, data)
        data = {"epoch": 1, "messages": ["YQ==", "!"]}
        self.assert_field("messages.1", RekeyLog.from_dict, data)
        self.assert_field("messages", RekeyLog.from_dict, {"epoch": 1})
        state = FilegroupState.of(KeyRegressionOwner("fg").reader_state()).to_dict()
        data = state | {"state": _b64(bytes(31))}
        self.assert_field("state", FilegroupState.from_dict, data)


class PolicyUploadTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        for msg in (
            PolicyUpload({"pcrs": {}}),
            PolicyUpload({"name": "rt"}, "rt", b"sig"),
        ):
            self.assertEqual(msg, PolicyUpload.from_dict(msg.to_dict()))

    def test_refusals(self) -> None:
        self.assert_field("policy", PolicyUpload.from_dict, {"policy": [1]})
        data = {"policy": {}, "signature": "***"}
        self.assert_field("signature", PolicyUpload.from_dict, data)
        self.assert_field("name", PolicyUpload.from_dict, {"policy": {}, "name": ""})


class ErrorBodyTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trip(self) -> None:
        for msg in (ErrorBody("bad_field", "'v' is not base64"), ErrorBody("x", "")):
            self.assertEqual(msg, ErrorBody.from_dict(msg.to_dict()))

    def test_refusals(self) -> None:
        self.assert_field("error", ErrorBody.from_dict, {"error": "not found"})
        data = {"error": {"code": "", "message": "m"}}
        self.assert_field("error.code", ErrorBody.from_dict, data)
        data = {"error": {"code": "c", "message": None}}
        self.assert_field("error.message", ErrorBody.from_dict, data)
