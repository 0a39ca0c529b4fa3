"""Typed wire messages of registration, provider EKs and monitor attestation
(:mod:`verifier.protocol.messages`): round trips and one refusal per kind
of field."""

from __future__ import annotations

import base64
import dataclasses
import uuid as uuid_mod
from typing import Any

import testtools

from trusted_testing.softtpm import SoftTpm
from verifier.common.tls import self_signed_certificate
from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.messages.monitor import MonitorChallenge, MonitorIdentity
from verifier.protocol.messages.provider import (
    ProviderEkRecord,
    ProviderEkRegistration,
    ProviderEkResult,
)
from verifier.protocol.messages.registration import (
    ActivationChallenge,
    ActivationProof,
    ActivationResult,
    RegistrationRecord,
    RegistrationRequest,
)

TPM = SoftTpm(ak_alg="ecc", ek_alg="ecc")
CERT = self_signed_certificate("agent", ["192.0.2.7"])[1].decode()
UUID = str(uuid_mod.uuid4())


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def request(**changes: Any) -> RegistrationRequest:
    req = RegistrationRequest(TPM.ek, b"\x30\x03der", TPM.ak, CERT, "192.0.2.7", 8892)
    return dataclasses.replace(req, **changes)


def record(**changes: Any) -> RegistrationRecord:
    rec = RegistrationRecord(
        UUID, TPM.ek, None, TPM.ak, CERT, "agent.example.org", 8892, True
    )
    return dataclasses.replace(rec, **changes)


class FieldKindsMixin:
    """Asserts for a refused field: its error type and that it is named."""

    def assert_field(self, field: str, call: Any, *args: Any) -> FieldError:
        exc = self.assertRaises(FieldError, call, *args)  # type: ignore[attr-defined]
        self.assertEqual(field, exc.field)  # type: ignore[attr-defined]
        self.assertEqual("bad_field", exc.code)  # type: ignore[attr-defined]
        return exc  # type: ignore[no-any-return]

    def assert_content(self, field: str, call: Any, *args: Any) -> MalformedError:
        exc = self.assertRaises(MalformedError, call, *args)  # type: ignore[attr-defined]
        self.assertNotIsInstance(exc, FieldError)  # type: ignore[attr-defined]
        self.assertEqual("malformed", exc.code)  # type: ignore[attr-defined]
        self.assertIn(f"'{field}'", str(exc))  # type: ignore[attr-defined]
        return exc  # type: ignore[no-any-return]


class RegistrationRequestTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trip(self) -> None:
        for req in (request(), request(ek_certificate=None)):
            self.assertEqual(req, RegistrationRequest.from_dict(req.to_dict()))

    def test_wire_form_is_base64_and_pem(self) -> None:
        data = request().to_dict()
        self.assertEqual(_b64(TPM.ek.to_bytes()), data["ek_public"])
        self.assertEqual(CERT, data["tls_cert"])
        self.assertEqual(8892, data["port"])

    def test_key_that_is_not_base64_is_a_bad_field(self) -> None:
        data = request().to_dict() | {"ek_public": "!!"}
        self.assert_field("ek_public", RegistrationRequest.from_dict, data)

    def test_key_that_is_not_a_tpm_public_is_malformed(self) -> None:
        data = request().to_dict() | {"ak_public": _b64(b"\x00\x02ab")}
        self.assert_content("ak_public", RegistrationRequest.from_dict, data)

    def test_tls_cert_that_is_not_a_certificate_is_refused(self) -> None:
        fake = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
        for value in ("x", fake, CERT + CERT):
            data = request().to_dict() | {"tls_cert": value}
            self.assert_content("tls_cert", RegistrationRequest.from_dict, data)
        self.assert_field("tls_cert", lambda: request(tls_cert=None))

    def test_port_out_of_range_or_not_an_integer_is_refused(self) -> None:
        for port in (0, 65536, -1, True, "8892", 8892.0, None):
            data = request().to_dict() | {"port": port}
            self.assert_field("port", RegistrationRequest.from_dict, data)

    def test_host_that_would_change_a_url_is_refused(self) -> None:
        for host in ("a b", "evil.org/path", "user@host", "", "-x.org", "x" * 300):
            data = request().to_dict() | {"host": host}
            self.assertRaises(MalformedError, RegistrationRequest.from_dict, data)
        for host in ("10.0.0.1", "::1", "node-1.example.org", "localhost"):
            self.assertEqual(host, request(host=host).host)

    def test_oversized_ek_certificate_is_refused(self) -> None:
        data = request().to_dict() | {"ek_certificate": _b64(bytes(8193))}
        self.assert_field("ek_certificate", RegistrationRequest.from_dict, data)

    def test_unknown_field_is_refused(self) -> None:
        data = request().to_dict() | {"prot": 1}
        self.assert_field("prot", RegistrationRequest.from_dict, data)

    def test_not_an_object_is_malformed(self) -> None:
        for data in (None, [], "x", 1):
            self.assertRaises(MalformedError, RegistrationRequest.from_dict, data)


class RegistrationRecordTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trip_and_canonical_uuid(self) -> None:
        rec = record()
        self.assertEqual(rec, RegistrationRecord.from_dict(rec.to_dict()))
        upper = RegistrationRecord.from_dict(rec.to_dict() | {"uuid": UUID.upper()})
        self.assertEqual(rec, upper)

    def test_unknown_fields_of_an_answer_are_ignored(self) -> None:
        data = record().to_dict() | {"registered_at": 1.5}
        self.assertEqual(record(), RegistrationRecord.from_dict(data))

    def test_activated_must_be_a_boolean(self) -> None:
        for value in ("true", 1, None):
            data = record().to_dict() | {"activated": value}
            self.assert_field("activated", RegistrationRecord.from_dict, data)

    def test_uuid_that_is_not_a_uuid_is_malformed(self) -> None:
        data = record().to_dict() | {"uuid": "not-a-uuid"}
        self.assert_content("uuid", RegistrationRecord.from_dict, data)
        self.assert_field("uuid", RegistrationRecord.from_dict, data | {"uuid": 5})

    def test_record_of_another_node_is_refused(self) -> None:
        record().check_node(UUID.upper())
        exc = self.assertRaises(
            MalformedError, record().check_node, str(uuid_mod.uuid4())
        )
        self.assertIn(UUID, str(exc))

    def test_base_url(self) -> None:
        self.assertEqual("https://agent.example.org:8892", record().base_url)
        self.assertEqual("https://[fd00::7]:9", record(host="fd00::7", port=9).base_url)


class ActivationTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        for msg in (
            ActivationChallenge(b"blob", b"secret"),
            ActivationProof(bytes(32)),
            ActivationResult(UUID, True),
        ):
            self.assertEqual(msg, type(msg).from_dict(msg.to_dict()))

    def test_empty_or_oversized_challenge_is_refused(self) -> None:
        self.assert_field("credential_blob", ActivationChallenge, b"", b"s")
        data = {"credential_blob": "YQ==", "encrypted_secret": _b64(bytes(1025))}
        self.assert_field("encrypted_secret", ActivationChallenge.from_dict, data)

    def test_credential_longer_than_a_digest_is_refused(self) -> None:
        self.assert_field("credential", ActivationProof.from_dict, {"credential": 1})
        data = {"credential": _b64(bytes(65))}
        self.assert_field("credential", ActivationProof.from_dict, data)

    def test_result_must_say_activated_as_a_boolean(self) -> None:
        data = {"uuid": UUID, "activated": "yes"}
        self.assert_field("activated", ActivationResult.from_dict, data)


class ProviderEkTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        for msg in (
            ProviderEkRegistration(TPM.ek, b"der"),
            ProviderEkRegistration(TPM.ek),
            ProviderEkRecord(UUID, TPM.ek, None, "compute-1"),
            ProviderEkResult(UUID, False),
        ):
            self.assertEqual(msg, type(msg).from_dict(msg.to_dict()))

    def test_registration_refusals(self) -> None:
        self.assert_field("ek_public", ProviderEkRegistration.from_dict, {})
        data = {"ek_public": _b64(b"junk")}
        self.assert_content("ek_public", ProviderEkRegistration.from_dict, data)
        data = ProviderEkRegistration(TPM.ek).to_dict() | {"ak_public": "x"}
        self.assert_field("ak_public", ProviderEkRegistration.from_dict, data)

    def test_record_refusals(self) -> None:
        good = ProviderEkRecord(UUID, TPM.ek, None, "compute-1").to_dict()
        self.assert_field(
            "provider", ProviderEkRecord.from_dict, good | {"provider": ""}
        )
        exc = self.assertRaises(
            MalformedError,
            ProviderEkRecord.from_dict(good).check_node,
            str(uuid_mod.uuid4()),
        )
        self.assertIn("instance asked for", str(exc))

    def test_result_must_say_registered(self) -> None:
        data = ProviderEkResult(UUID, True).to_dict() | {"registered": False}
        self.assert_field("registered", ProviderEkResult.from_dict, data)


class MonitorMessagesTest(FieldKindsMixin, testtools.TestCase):
    def test_round_trips(self) -> None:
        for msg in (
            MonitorChallenge(bytes(range(32))),
            MonitorIdentity(TPM.ak, TPM.ek, b"der", (0, 7, 16)),
            MonitorIdentity(TPM.ak, TPM.ek, None, ()),
        ):
            self.assertEqual(msg, type(msg).from_dict(msg.to_dict()))

    def test_nonce_not_hex_is_a_bad_field_and_too_short_is_malformed(self) -> None:
        self.assert_field("nonce", MonitorChallenge.from_dict, {"nonce": "zz"})
        self.assert_field("nonce", MonitorChallenge.from_dict, {"nonce": None})
        exc = self.assertRaises(
            MalformedError, MonitorChallenge.from_dict, {"nonce": "00" * 8}
        )
        self.assertEqual("malformed", exc.code)

    def test_identity_with_another_aks_name_is_refused(self) -> None:
        data = MonitorIdentity(TPM.ak, TPM.ek, None, (16,)).to_dict()
        data["ak_name"] = TPM.ek.name.hex()
        self.assert_content("ak_name", MonitorIdentity.from_dict, data)

    def test_identity_pcrs_must_be_distinct_indices(self) -> None:
        data = MonitorIdentity(TPM.ak, TPM.ek, None, (16,)).to_dict()
        for pcrs in ([24], [3, 3], [7, 1], "16", [True]):
            self.assert_field("pcrs", MonitorIdentity.from_dict, data | {"pcrs": pcrs})
