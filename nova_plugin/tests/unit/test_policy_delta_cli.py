"""``trusted-tenant policy add FILE --base REF`` (issue 28): the base's
digest, resolved through the verifier's API, is written into the document
before it is signed and sent; bad input is one line and exit status 2."""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
from typing import Any

import testtools
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from nova_plugin.cliargs import with_base
from nova_plugin.commands.policies import PolicyAdd
from nova_plugin.exceptions import UsageError
from nova_plugin.tenant import Tenant, TenantConfig
from nova_plugin.tests.unit.test_tenant_cli import TenantCliCase, run_tenant
from verifier.protocol.ima.policy import canonical_document

BASE = hashlib.sha256(b"web@4").hexdigest()
OTHER = hashlib.sha256(b"web@3").hexdigest()
DELTA = {
    "name": "web",
    "version": 5,
    "digests": {"/usr/bin/new": ["sha256:" + hashlib.sha256(b"new").hexdigest()]},
}


class RecordingVerifier:
    """The verifier's side of the session, in memory: GET of a policy
    answers its metadata, POST stores and answers what it was sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        if method == "GET":
            return {"name": "web", "version": 4, "digest": BASE, "base": None}
        policy = body["policy"]
        return {
            "name": policy["name"],
            "version": policy["version"],
            "entries": len(policy["digests"]),
            "digest": hashlib.sha256(canonical_document(policy)).hexdigest(),
            "base": {"name": "web", "version": 4, "digest": policy.get("base")},
        }


class WithBaseTest(testtools.TestCase):
    def test_the_base_digest_is_written_into_the_document(self) -> None:
        out = with_base(DELTA, BASE, "web@4", "d.json")
        self.assertEqual(BASE, out["base"])
        self.assertNotIn("base", DELTA)  # the caller's document is untouched
        self.assertEqual(out, with_base(out, BASE, "web@4", "d.json"))

    def test_a_file_naming_another_base_is_refused_naming_both(self) -> None:
        exc = self.assertRaises(
            UsageError, with_base, {**DELTA, "base": OTHER}, BASE, "web@4", "d.json"
        )
        self.assertIn(OTHER, str(exc))
        self.assertIn(f"web@4 ({BASE})", str(exc))


class PolicyAddBaseTest(TenantCliCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.directory
        self.file = os.path.join(self.dir, "delta.json")
        with open(self.file, "w") as f:
            json.dump(DELTA, f)

    def add(self, **options: Any) -> tuple[RecordingVerifier, Any]:
        verifier = RecordingVerifier()
        config = TenantConfig("https://r.test", "https://v.test", None, None, None)
        tenant = Tenant(config, verifier=verifier)  # type: ignore[arg-type]
        args = argparse.Namespace(
            file=self.file,
            name=None,
            signature=None,
            sign_key=None,
            base=None,
            kind="runtime",
        )
        vars(args).update(options)
        PolicyAdd().check(args)
        result = asyncio.run(PolicyAdd().run(tenant, args))
        return verifier, result

    def test_the_base_is_resolved_then_sent_in_the_document(self) -> None:
        verifier, result = self.add(base="web@4")
        (get, post) = verifier.calls
        self.assertEqual(("GET", "/v1/policies/runtime/web@4"), get[:2])
        self.assertEqual("POST", post[0])
        self.assertEqual({**DELTA, "base": BASE}, post[2]["policy"])
        self.assertIn("version 5 stored over version 4", result["message"])

    def test_sign_key_signs_the_delta_with_its_base(self) -> None:
        for key in (
            ed25519.Ed25519PrivateKey.generate(),
            ec.generate_private_key(ec.SECP256R1()),
        ):
            pem = os.path.join(self.dir, "key.pem")
            with open(pem, "wb") as f:
                f.write(
                    key.private_bytes(
                        serialization.Encoding.PEM,
                        serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption(),
                    )
                )
            verifier, _ = self.add(base=BASE, sign_key=pem)
            body = verifier.calls[-1][2]
            self.assertEqual(BASE, body["policy"]["base"])
            signature = base64.b64decode(body["signature"])
            signed = canonical_document({**DELTA, "base": BASE})
            public = key.public_key()
            if isinstance(public, ed25519.Ed25519PublicKey):
                public.verify(signature, signed)
            else:
                public.verify(signature, signed, ec.ECDSA(hashes.SHA256()))

    def test_base_on_a_measured_boot_policy_is_exit_2(self) -> None:
        code, err = run_tenant(
            [
                *self.settings,
                "policy",
                "add",
                self.file,
                "--base",
                "web",
                "--kind",
                "measured-boot",
            ]  # fmt: skip
        )
        self.assertEqual(2, code)
        self.assertIn("--base: runtime policies only", err)
        self.assertEqual(1, len(err.strip().splitlines()))

    def test_a_signature_of_the_file_without_its_base_is_exit_2(self) -> None:
        sig = os.path.join(self.dir, "delta.sig")
        with open(sig, "wb") as f:
            f.write(b"x" * 64)
        code, err = run_tenant(
            [
                *self.settings,
                "policy",
                "add",
                self.file,
                "--base",
                "web",
                "--signature",
                sig,
            ]  # fmt: skip
        )
        self.assertEqual(2, code)
        self.assertIn("without a base: sign the delta with --sign-key", err)
        self.assertEqual(1, len(err.strip().splitlines()))

    def test_an_unusable_sign_key_is_exit_2(self) -> None:
        junk = os.path.join(self.dir, "junk.pem")
        with open(junk, "w") as f:
            f.write("not a key")
        for key in (junk, os.path.join(self.dir, "missing.pem")):
            code, err = run_tenant(
                [*self.settings, "policy", "add", self.file, "--sign-key", key]
            )
            self.assertEqual(2, code, err)
            self.assertIn(f"--sign-key {key}", err)
            self.assertEqual(1, len(err.strip().splitlines()))
