"""Tests of ``trusted-puppet-autosign`` against a real HTTPS server (mutual
TLS) playing the verifier's ``GET /v1/nodes/<uuid>``.

The real verifier and puppetserver run in
``ipsec_puppet_vault_hooks.tests.functional.test_puppet``.
"""

from __future__ import annotations

import io
import os
import sys
import uuid as uuid_mod

import fixtures
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import AttributeOID, NameOID
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import autosign
from ipsec_puppet_vault_hooks.conf import puppet_autosign as autosign_conf
from trusted_testing.cluster import free_port
from trusted_testing.https_server import HttpsServer, Pki, Seen

_KEY = rsa.generate_private_key(65537, 2048)


def make_csr(
    cn: str,
    pp_uuid: str | None = None,
    challenge: str | None = None,
    key: rsa.RSAPrivateKey = _KEY,
) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    )
    if pp_uuid is not None:
        value = pp_uuid.encode()
        der = bytes([0x0C, len(value)]) + value  # UTF8String, as Puppet does
        builder = builder.add_extension(
            x509.UnrecognizedExtension(autosign.PP_UUID_OID, der), critical=False
        )
    if challenge is not None:
        builder = builder.add_attribute(
            AttributeOID.CHALLENGE_PASSWORD, challenge.encode()
        )
    csr = builder.sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


class _AutosignTestBase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.pki = Pki(self.tmp, client="tenant")
        self.uuid = str(uuid_mod.uuid4())
        self.states = {self.uuid: "attested"}
        self.server = HttpsServer(self.pki, self._verifier)
        self.addCleanup(self.server.stop)
        self.conf = cfg.ConfigOpts()
        autosign_conf.register_opts(self.conf)
        self.conf([])
        self._set(
            verifier_url=self.server.url,
            cert_file=self.pki.cert_file,
            key_file=self.pki.key_file,
            ca_file=self.pki.ca_file,
        )

    def _verifier(self, seen: Seen) -> tuple[int, object]:
        uuid = seen.path.rsplit("/", 1)[-1]
        if seen.method != "GET" or uuid not in self.states:
            return 404, {"error": "not_found", "detail": f"no node {uuid}"}
        return 200, {"uuid": uuid, "state": self.states[uuid]}

    def _set(self, **kw: object) -> None:
        for key, value in kw.items():
            self.conf.set_override(key, value, group="puppet_autosign")

    def check(self, certname: str, csr: bytes) -> autosign.SigningDecision:
        return autosign.check_request(self.conf, certname, csr)


class AutosignTestCase(_AutosignTestBase):
    def test_attested_node_is_signed(self) -> None:
        verdict = self.check(self.uuid, make_csr(self.uuid))
        self.assertTrue(verdict, verdict.reason)
        (seen,) = self.server.seen
        self.assertEqual(("GET", f"/v1/nodes/{self.uuid}"), (seen.method, seen.path))
        self.assertEqual("tenant", seen.client_cn)

    def test_states_other_than_attested_are_refused(self) -> None:
        for state in (
            "registered",
            "bootstrapping",
            "failed",
            "unreachable",
            "revoked",
        ):
            self.states[self.uuid] = state
            verdict = self.check(self.uuid, make_csr(self.uuid))
            self.assertFalse(verdict)
            self.assertIn(f"is {state}, not attested", verdict.reason)

    def test_unknown_node_is_refused(self) -> None:
        other = str(uuid_mod.uuid4())
        verdict = self.check(other, make_csr(other))
        self.assertFalse(verdict)
        self.assertIn("not enrolled", verdict.reason)

    def test_certname_not_matching_the_template_is_refused(self) -> None:
        verdict = self.check("puppet.example.org", make_csr("puppet.example.org"))
        self.assertFalse(verdict)
        self.assertIn("does not match", verdict.reason)
        self.assertEqual([], self.server.seen)

    def test_certname_template(self) -> None:
        self._set(certname_template="{uuid}.nodes.example.org")
        certname = f"{self.uuid}.nodes.example.org"
        self.assertTrue(self.check(certname, make_csr(certname)))
        self.assertFalse(self.check(self.uuid, make_csr(self.uuid)))

    def test_bad_template_is_refused(self) -> None:
        self._set(certname_template="node")
        verdict = self.check(self.uuid, make_csr(self.uuid))
        self.assertFalse(verdict)
        self.assertIn("configuration", verdict.reason)

    def test_subject_must_be_the_certname(self) -> None:
        other = str(uuid_mod.uuid4())
        self.states[other] = "attested"
        verdict = self.check(self.uuid, make_csr(other))
        self.assertFalse(verdict)
        self.assertIn(f"not CN={self.uuid}", verdict.reason)

    def test_malformed_request_is_refused(self) -> None:
        verdict = self.check(self.uuid, b"-----BEGIN CERTIFICATE REQUEST-----\nxx")
        self.assertFalse(verdict)
        self.assertIn("malformed certificate request", verdict.reason)

    def test_tampered_request_signature_is_refused(self) -> None:
        der = bytearray(
            x509.load_pem_x509_csr(make_csr(self.uuid)).public_bytes(
                serialization.Encoding.DER
            )
        )
        der[-5] ^= 0x01  # inside the signature
        pem = x509.load_der_x509_csr(bytes(der)).public_bytes(
            serialization.Encoding.PEM
        )
        verdict = self.check(self.uuid, pem)
        self.assertFalse(verdict)
        self.assertIn("signature", verdict.reason)

    def test_pp_uuid_required(self) -> None:
        self._set(require_pp_uuid=True)
        self.assertTrue(self.check(self.uuid, make_csr(self.uuid, pp_uuid=self.uuid)))
        missing = self.check(self.uuid, make_csr(self.uuid))
        self.assertIn("no pp_uuid", missing.reason)
        wrong = self.check(
            self.uuid, make_csr(self.uuid, pp_uuid=str(uuid_mod.uuid4()))
        )
        self.assertIn("pp_uuid extension is not", wrong.reason)

    def test_challenge_password(self) -> None:
        self._set(challenge_password="s3cret")
        self.assertTrue(self.check(self.uuid, make_csr(self.uuid, challenge="s3cret")))
        self.assertIn(
            "wrong", self.check(self.uuid, make_csr(self.uuid, challenge="nope")).reason
        )
        self.assertIn(
            "no challengePassword", self.check(self.uuid, make_csr(self.uuid)).reason
        )

    def test_verifier_down_is_refused(self) -> None:
        self._set(verifier_url=f"https://127.0.0.1:{free_port()}")
        verdict = self.check(self.uuid, make_csr(self.uuid))
        self.assertFalse(verdict)
        self.assertIn("verifier unreachable", verdict.reason)

    def test_untrusted_verifier_is_refused(self) -> None:
        other = Pki(os.path.join(self.tmp, "other"))
        self._set(ca_file=other.ca_file)
        verdict = self.check(self.uuid, make_csr(self.uuid))
        self.assertFalse(verdict)
        self.assertIn("verifier unreachable", verdict.reason)

    def test_verifier_error_is_refused(self) -> None:
        self.server.handler = lambda seen: (500, {"error": "internal"})
        verdict = self.check(self.uuid, make_csr(self.uuid))
        self.assertFalse(verdict)
        self.assertIn("verifier answered 500", verdict.reason)

    def test_missing_options_are_refused(self) -> None:
        self.conf.clear_override("verifier_url", group="puppet_autosign")
        verdict = self.check(self.uuid, make_csr(self.uuid))
        self.assertFalse(verdict)
        self.assertIn("verifier_url", verdict.reason)


class MainTestCase(_AutosignTestBase):
    """The console script: exit status and messages, as Puppet sees them."""

    def _main(self, certname: str, csr: bytes) -> tuple[int, str, str]:
        conf = os.path.join(self.tmp, "autosign.conf")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(
                "[puppet_autosign]\n"
                f"verifier_url = {self.server.url}\n"
                f"cert_file = {self.pki.cert_file}\n"
                f"key_file = {self.pki.key_file}\n"
                f"ca_file = {self.pki.ca_file}\n"
            )
        stdin = io.TextIOWrapper(io.BytesIO(csr))
        out, err = io.StringIO(), io.StringIO()
        self.useFixture(fixtures.MonkeyPatch("sys.stdin", stdin))
        self.useFixture(fixtures.MonkeyPatch("sys.stdout", out))
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", err))
        code = autosign.main(["--config-file", conf, certname])
        return code, out.getvalue(), err.getvalue()

    def test_main_signs_attested(self) -> None:
        code, out, err = self._main(self.uuid, make_csr(self.uuid))
        self.assertEqual(0, code, err)
        self.assertIn(f"signing {self.uuid}", out)

    def test_main_refuses_with_reason_on_stderr(self) -> None:
        self.states[self.uuid] = "revoked"
        code, out, err = self._main(self.uuid, make_csr(self.uuid))
        self.assertEqual(1, code)
        self.assertEqual("", out)
        self.assertIn(f"refusing {self.uuid}: node {self.uuid} is revoked", err)

    def test_main_refuses_oversized_input(self) -> None:
        code, _, err = self._main(self.uuid, b"x" * (autosign._MAX_CSR + 10))
        self.assertEqual(1, code)
        self.assertIn("too large", err)

    def test_main_without_certname_is_a_usage_error(self) -> None:
        err = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", err))
        self.useFixture(
            fixtures.MonkeyPatch("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
        )
        self.assertEqual(2, autosign.main(["--config-file", os.devnull]))
        self.assertIn("certname", err.getvalue())

    def test_main_bad_config_file_is_a_usage_error(self) -> None:
        err = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch("sys.stderr", err))
        missing = os.path.join(self.tmp, "missing.conf")
        self.assertEqual(2, autosign.main(["--config-file", missing, self.uuid]))
        self.assertIn("missing.conf", err.getvalue())

    def test_console_script_is_installed(self) -> None:
        exe = os.path.join(os.path.dirname(sys.executable), "trusted-puppet-autosign")
        self.assertTrue(os.access(exe, os.X_OK), exe)
