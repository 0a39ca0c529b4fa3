"""Registrar logic (``verifier.registrar.Registrar``) against SoftTpm."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import uuid as uuid_mod

import testtools
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trusted_testing.softtpm import SoftTpm
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol import EvidenceError
from verifier.protocol import tpm as t
from verifier.registrar.service import Registrar, Registration
from verifier.tests.dbfixture import SqliteDatabase

TLS_CERT = "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"


@functools.cache
def _rsa_tpm() -> SoftTpm:
    return SoftTpm(ak_alg="ecc", ek_alg="rsa")


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _ek_cert(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    public_key: object,
    valid_days: int = 365,
    common_name: str | None = None,
) -> bytes:
    ca_key, ca_cert = ca
    now = datetime.datetime.now(datetime.UTC)
    subject = (
        [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


class RegistrarTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.engine = self.useFixture(SqliteDatabase()).engine
        self.registrar = Registrar(self.engine)
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.uuid = str(uuid_mod.uuid4())

    def registration(
        self, tpm: SoftTpm | None = None, **changes: object
    ) -> Registration:
        tpm = tpm or self.tpm
        reg = Registration(
            uuid=self.uuid,
            ek_public=tpm.ek.to_bytes(),
            ek_certificate=None,
            ak_public=tpm.ak.to_bytes(),
            tls_cert=TLS_CERT,
            host="192.0.2.7",
            port=8892,
        )
        return dataclasses.replace(reg, **changes)  # type: ignore[arg-type]

    def register_and_activate(self, tpm: SoftTpm | None = None, **changes: object):
        tpm = tpm or self.tpm
        challenge = self.registrar.register(self.registration(tpm, **changes))
        credential = tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        self.registrar.activate(self.uuid, credential)
        return credential

    # -- register / activate ------------------------------------------------

    def _register_and_activate(self, tpm: SoftTpm) -> None:
        challenge = self.registrar.register(self.registration(tpm))
        # Nothing is in force before the AK is activated.
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)
        credential = tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        self.registrar.activate(self.uuid, credential)
        record = self.registrar.get(self.uuid)
        self.assertTrue(record.activated)
        self.assertEqual(tpm.ak.to_bytes(), record.ak_public)
        self.assertEqual(tpm.ek.to_bytes(), record.ek_public)
        self.assertEqual(
            (TLS_CERT, "192.0.2.7", 8892), (record.tls_cert, record.host, record.port)
        )

    def test_register_and_activate_ecc_ek(self) -> None:
        self._register_and_activate(self.tpm)

    def test_register_and_activate_rsa_ek(self) -> None:
        self._register_and_activate(_rsa_tpm())

    def test_activation_is_single_use(self) -> None:
        challenge = self.registrar.register(self.registration())
        credential = self.tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        self.registrar.activate(self.uuid, credential)
        with self.assertRaises(RequestError) as ctx:
            self.registrar.activate(self.uuid, credential)
        self.assertEqual(403, ctx.exception.status)
        self.assertTrue(self.registrar.get(self.uuid).activated)

    def test_wrong_credential_is_refused(self) -> None:
        self.registrar.register(self.registration())
        with self.assertRaises(RequestError) as ctx:
            self.registrar.activate(self.uuid, os.urandom(32))
        self.assertEqual(403, ctx.exception.status)
        self.assertEqual("activation_failed", ctx.exception.code)
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)

    def test_challenge_does_not_open_on_another_tpm(self) -> None:
        challenge = self.registrar.register(self.registration())
        other = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        with self.assertRaises(EvidenceError) as ctx:
            other.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            )
        self.assertEqual("credential", ctx.exception.reason)
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)

    def test_reregistration_is_in_force_once_activated(self) -> None:
        old_credential = self.register_and_activate()
        # Same EK, new AK (the node restarted): it must prove the new AK.
        new_ak = SoftTpm(ak_alg="ecc", ek_key=self.tpm.ek_key)
        challenge = self.registrar.register(
            self.registration(new_ak, host="192.0.2.8", port=9000)
        )
        record = self.registrar.get(self.uuid)
        self.assertTrue(record.activated)
        self.assertEqual(self.tpm.ak.to_bytes(), record.ak_public)
        self.assertEqual(("192.0.2.7", 8892), (record.host, record.port))
        self.assertRaises(
            RequestError, self.registrar.activate, self.uuid, old_credential
        )
        credential = new_ak.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        self.registrar.activate(self.uuid, credential)
        record = self.registrar.get(self.uuid)
        self.assertTrue(record.activated)
        self.assertEqual(new_ak.ak.to_bytes(), record.ak_public)
        self.assertEqual(("192.0.2.8", 9000), (record.host, record.port))

    def test_reregistration_with_foreign_ak_keeps_old_in_force(self) -> None:
        self.register_and_activate()
        before = self.registrar.get(self.uuid)
        # The attacker knows the victim's (public) EK, but not its TPM.
        attacker = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        challenge = self.registrar.register(
            self.registration(
                ek_public=self.tpm.ek.to_bytes(),
                ak_public=attacker.ak.to_bytes(),
                host="203.0.113.9",
            )
        )
        self.assertEqual(before, self.registrar.get(self.uuid))
        with self.assertRaises(EvidenceError):
            attacker.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            )
        self.assertRaises(
            RequestError, self.registrar.activate, self.uuid, os.urandom(32)
        )
        self.assertEqual(before, self.registrar.get(self.uuid))
        self.assertTrue(self.registrar.get(self.uuid).activated)

    def test_concurrent_pending_registration_does_not_break_activation(
        self,
    ) -> None:
        challenge = self.registrar.register(self.registration())
        attacker = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.registrar.register(self.registration(ak_public=attacker.ak.to_bytes()))
        credential = self.tpm.activate_credential(
            challenge.credential_blob, challenge.encrypted_secret
        )
        self.registrar.activate(self.uuid, credential)
        self.assertEqual(
            self.tpm.ak.to_bytes(), self.registrar.get(self.uuid).ak_public
        )

    def test_pending_registrations_per_node_are_bounded(self) -> None:
        challenges = [self.registrar.register(self.registration()) for _ in range(6)]
        oldest = self.tpm.activate_credential(
            challenges[0].credential_blob, challenges[0].encrypted_secret
        )
        self.assertRaises(RequestError, self.registrar.activate, self.uuid, oldest)
        newest = self.tpm.activate_credential(
            challenges[-1].credential_blob, challenges[-1].encrypted_secret
        )
        self.registrar.activate(self.uuid, newest)
        self.assertTrue(self.registrar.get(self.uuid).activated)

    def test_reregister_with_other_ek_conflicts(self) -> None:
        self.register_and_activate()
        before = self.registrar.get(self.uuid)
        other = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        with self.assertRaises(ConflictError) as ctx:
            self.registrar.register(self.registration(other, host="203.0.113.9"))
        self.assertEqual("ek_mismatch", ctx.exception.code)
        self.assertEqual(409, ctx.exception.status)
        self.assertEqual(before, self.registrar.get(self.uuid))

    def test_uuid_is_canonicalised(self) -> None:
        self.register_and_activate(uuid=self.uuid.upper())
        self.assertEqual(self.uuid, self.registrar.get(self.uuid.upper()).uuid)
        self.assertEqual([self.uuid], [r.uuid for r in self.registrar.list()])

    def test_unknown_node(self) -> None:
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)
        self.assertRaises(NotFoundError, self.registrar.delete, self.uuid)
        self.assertRaises(
            NotFoundError, self.registrar.activate, self.uuid, os.urandom(32)
        )

    def test_delete(self) -> None:
        self.register_and_activate()
        self.registrar.delete(self.uuid)
        self.assertRaises(NotFoundError, self.registrar.get, self.uuid)
        self.assertEqual([], self.registrar.list())

    # -- key templates ------------------------------------------------------

    def _ak_with(self, attributes: int) -> bytes:
        key = self.tpm.ak_key.public_key()
        scheme = (t.ALG_ECDSA, t.ALG_SHA256)
        return t.make_public(key, attributes, scheme).to_bytes()  # type: ignore[arg-type]

    def test_unrestricted_ak_is_refused(self) -> None:
        attrs = (
            t.ATTR_FIXED_TPM
            | t.ATTR_FIXED_PARENT
            | t.ATTR_SENSITIVE_DATA_ORIGIN
            | t.ATTR_USER_WITH_AUTH
            | t.ATTR_SIGN
        )
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(self.registration(ak_public=self._ak_with(attrs)))
        self.assertEqual("ak_template", ctx.exception.code)
        self.assertEqual(400, ctx.exception.status)
        self.assertEqual([], self.registrar.list())

    def test_decrypting_ak_is_refused(self) -> None:
        attrs = (
            t.ATTR_FIXED_TPM
            | t.ATTR_FIXED_PARENT
            | t.ATTR_RESTRICTED
            | t.ATTR_SIGN
            | t.ATTR_DECRYPT
        )
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(self.registration(ak_public=self._ak_with(attrs)))
        self.assertEqual("ak_template", ctx.exception.code)

    def test_ak_as_ek_is_refused(self) -> None:
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(self.registration(ek_public=self.tpm.ak.to_bytes()))
        self.assertEqual("ek_template", ctx.exception.code)

    # -- EK certificates ----------------------------------------------------

    def test_ek_certificate_from_anchor_is_accepted(self) -> None:
        ca = _ca("TPM vendor CA")
        self.registrar = Registrar(self.engine, [ca[1]], require_ek_certificate=True)
        cert = _ek_cert(ca, self.tpm.ek_key.public_key())
        self.register_and_activate(ek_certificate=cert)
        self.assertEqual(cert, self.registrar.get(self.uuid).ek_certificate)

    def test_ek_certificate_from_another_ca_is_refused(self) -> None:
        trusted, rogue = _ca("TPM vendor CA"), _ca("TPM vendor CA")
        registrar = Registrar(self.engine, [trusted[1]])
        cert = _ek_cert(rogue, self.tpm.ek_key.public_key())
        with self.assertRaises(RequestError) as ctx:
            registrar.register(self.registration(ek_certificate=cert))
        self.assertEqual("ek_certificate", ctx.exception.code)
        self.assertEqual([], registrar.list())

    def test_ek_certificate_for_another_key_is_refused(self) -> None:
        ca = _ca("TPM vendor CA")
        registrar = Registrar(self.engine, [ca[1]])
        other_key = ec.generate_private_key(ec.SECP256R1()).public_key()
        with self.assertRaises(RequestError) as ctx:
            registrar.register(
                self.registration(ek_certificate=_ek_cert(ca, other_key))
            )
        self.assertEqual("ek_certificate", ctx.exception.code)
        self.assertIn("another key", ctx.exception.detail)

    def test_expired_ek_certificate_is_refused(self) -> None:
        ca = _ca("TPM vendor CA")
        registrar = Registrar(self.engine, [ca[1]])
        cert = _ek_cert(ca, self.tpm.ek_key.public_key(), valid_days=-1)
        with self.assertRaises(RequestError) as ctx:
            registrar.register(self.registration(ek_certificate=cert))
        self.assertEqual("ek_certificate", ctx.exception.code)

    def test_garbage_ek_certificate_is_refused(self) -> None:
        ca = _ca("TPM vendor CA")
        registrar = Registrar(self.engine, [ca[1]])
        with self.assertRaises(RequestError) as ctx:
            registrar.register(self.registration(ek_certificate=b"\x30\x03junk"))
        self.assertEqual("ek_certificate", ctx.exception.code)

    def test_missing_ek_certificate_when_required_is_refused(self) -> None:
        ca = _ca("TPM vendor CA")
        for anchors in ([ca[1]], []):
            registrar = Registrar(self.engine, anchors, require_ek_certificate=True)
            with self.assertRaises(RequestError) as ctx:
                registrar.register(self.registration())
            self.assertEqual("ek_certificate", ctx.exception.code)
        self.assertEqual([], self.registrar.list())

    def test_missing_ek_certificate_accepted_when_not_required(self) -> None:
        ca = _ca("TPM vendor CA")
        self.registrar = Registrar(self.engine, [ca[1]])
        self.register_and_activate()
        self.assertIsNone(self.registrar.get(self.uuid).ek_certificate)

    # -- anonymous registrations (identity by the TPM) ------------------------

    def test_anonymous_registration_with_anchored_ek_certificate(self) -> None:
        ca = _ca("swtpm-localca")
        self.registrar = Registrar(self.engine, [ca[1]])
        cert = _ek_cert(ca, self.tpm.ek_key.public_key())
        challenge = self.registrar.register(
            self.registration(ek_certificate=cert), anonymous=True
        )
        self.registrar.activate(
            self.uuid,
            self.tpm.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            ),
        )
        self.assertTrue(self.registrar.get(self.uuid).activated)

    def test_anonymous_registration_without_ek_cert_is_refused(self) -> None:
        ca = _ca("swtpm-localca")
        self.registrar = Registrar(self.engine, [ca[1]])
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(self.registration(), anonymous=True)
        self.assertEqual((403, "ek_certificate_required"),
                         (ctx.exception.status, ctx.exception.code))  # fmt: skip

    def test_anonymous_registration_with_foreign_ca_ek_cert_is_refused(
        self,
    ) -> None:
        trusted, rogue = _ca("swtpm-localca"), _ca("swtpm-localca")
        self.registrar = Registrar(self.engine, [trusted[1]])
        cert = _ek_cert(rogue, self.tpm.ek_key.public_key())
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(
                self.registration(ek_certificate=cert), anonymous=True
            )
        self.assertEqual("ek_certificate", ctx.exception.code)

    def test_anonymous_registration_with_ek_cert_naming_another_instance_is_refused(
        self,
    ) -> None:
        ca = _ca("swtpm-localca")
        self.registrar = Registrar(self.engine, [ca[1]])
        other = str(uuid_mod.uuid4())
        cert = _ek_cert(
            ca, self.tpm.ek_key.public_key(), common_name=f"instance-00000007:{other}"
        )
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(
                self.registration(ek_certificate=cert), anonymous=True
            )
        self.assertEqual((403, "ek_certificate_other_instance"),
                         (ctx.exception.status, ctx.exception.code))  # fmt: skip

    def test_anonymous_registration_with_ek_cert_naming_this_instance(self) -> None:
        ca = _ca("swtpm-localca")
        self.registrar = Registrar(self.engine, [ca[1]])
        name = f"instance-00000007:{self.uuid.upper()}"
        cert = _ek_cert(ca, self.tpm.ek_key.public_key(), common_name=name)
        challenge = self.registrar.register(
            self.registration(ek_certificate=cert), anonymous=True
        )
        self.assertTrue(challenge.credential_blob)

    def test_anonymous_registration_without_anchors_is_refused(self) -> None:
        ca = _ca("swtpm-localca")
        cert = _ek_cert(ca, self.tpm.ek_key.public_key())
        with self.assertRaises(RequestError) as ctx:
            self.registrar.register(
                self.registration(ek_certificate=cert), anonymous=True
            )
        self.assertEqual((403, "anonymous_registration_disabled"),
                         (ctx.exception.status, ctx.exception.code))  # fmt: skip


class NamedInstanceTest(testtools.TestCase):
    def test_swtpm_vmid_names_the_instance(self) -> None:
        from verifier.protocol.ekcert import named_instance

        key = ec.generate_private_key(ec.SECP256R1()).public_key()
        uuid = str(uuid_mod.uuid4())
        ca = _ca("swtpm-localca")
        cert = _ek_cert(ca, key, common_name=f"instance-0000000a:{uuid.upper()}")
        self.assertEqual(uuid, named_instance(cert))
        self.assertIsNone(named_instance(_ek_cert(ca, key, common_name="STM TPM EK")))
        self.assertIsNone(named_instance(_ek_cert(ca, key, common_name="a:b")))
        self.assertIsNone(named_instance(_ek_cert(ca, key)))
        self.assertIsNone(named_instance(b"\x30\x03junk"))
