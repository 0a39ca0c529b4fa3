"""Runtime policy deltas through the real verifier (issue 28): registrar and
verifier processes that accept signed policies only; the tenant's
``trusted-tenant`` stores a base and a delta over it (``policy add
--base web@4 --sign-key``), reads both back, and the verifier refuses a
delta over a missing base (404 naming it), a delta whose signature does not
cover its base, and the deletion of a base a delta extends (409)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, ClassVar

import testtools
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from nova_plugin.exceptions import ServiceError
from trusted_testing.cluster import LocalCluster
from verifier.protocol.ima.policy import canonical_document


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


BASE = {
    "name": "web",
    "version": 4,
    "digests": {
        f"/usr/lib/x86_64-linux-gnu/lib{i}.so": [sha(b"%d" % i)] for i in range(300)
    },
    "excludes": ["/tmp/"],
}
DELTA = {
    "name": "web",
    "version": 5,
    "digests": {"/usr/sbin/nginx": [sha(b"nginx 1.24.1")]},
}


class PolicyDeltaTest(testtools.TestCase):
    """One registrar and one verifier for the class (no nodes)."""

    cluster: ClassVar[LocalCluster]
    tmp: ClassVar[tempfile.TemporaryDirectory[str]]
    sign_key: ClassVar[str]
    key: ClassVar[ed25519.Ed25519PrivateKey]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory(prefix="policy-deltas-")
        key = ed25519.Ed25519PrivateKey.generate()
        cls.sign_key = os.path.join(cls.tmp.name, "sign.pem")
        public = os.path.join(cls.tmp.name, "sign.pub.pem")
        with open(cls.sign_key, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        with open(public, "wb") as f:
            f.write(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                )
            )
        cls.key = key
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp.name, "cluster"),
            nodes=0,
            verifier_options={"policy_signing_keys": [public]},
        )
        try:
            cls.cluster.start_services()
        except Exception:
            cls.cluster.stop()
            cls.tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.cluster.stop()
        finally:
            cls.tmp.cleanup()
            super().tearDownClass()

    def write(self, name: str, document: dict[str, Any]) -> str:
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            json.dump(document, f)
        return path

    def tenant(self, *argv: str) -> subprocess.CompletedProcess[str]:
        script = os.path.join(os.path.dirname(sys.executable), "trusted-tenant")
        return subprocess.run(
            [script, *argv],
            env=dict(os.environ, **self.cluster.tenant_env()),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def ok(self, *argv: str) -> str:
        done = self.tenant(*argv)
        self.assertEqual(0, done.returncode, done.stderr)
        return done.stdout

    def api(self, work: Any) -> Any:
        async def run() -> Any:
            tenant = self.cluster.tenant()
            try:
                return await work(tenant)
            finally:
                await tenant.close()

        return asyncio.run(run())

    def test_a_signed_delta_over_a_base_is_stored_and_read_back(self) -> None:
        base_file = self.write("base.json", BASE)
        out = self.ok("policy", "add", base_file, "--sign-key", self.sign_key)
        self.assertIn("'web' version 4 stored", out)
        delta_file = self.write("delta.json", DELTA)
        out = self.ok(
            "policy", "add", delta_file, "--base", "web@4", "--sign-key", self.sign_key
        )
        self.assertIn("'web' version 5 stored over version 4 (1 entries", out)
        base_digest = hashlib.sha256(canonical_document(BASE)).hexdigest()
        delta_digest = hashlib.sha256(
            canonical_document({**DELTA, "base": base_digest})
        ).hexdigest()
        shown = json.loads(self.ok("policy", "show", "web"))  # the newest: v5
        self.assertEqual(delta_digest, shown["digest"])
        self.assertEqual(
            {"name": "web", "version": 4, "digest": base_digest}, shown["base"]
        )
        self.assertEqual(base_digest, shown["policy"]["base"])
        self.assertEqual(DELTA["digests"], shown["policy"]["digests"])
        self.assertTrue(shown["signed"])
        self.assertIsNone(json.loads(self.ok("policy", "show", "web@4"))["base"])
        listed = self.ok("policy", "list").splitlines()
        self.assertEqual(2, len(listed))
        self.assertIn("web@5  1 entries  signed", listed[1])
        self.assertIn("delta over @4", listed[1])
        # the same file again is the same policy (idempotent)
        self.ok(
            "policy", "add", delta_file, "--base", base_digest, "--sign-key",
            self.sign_key,
        )  # fmt: skip

        # a base a delta extends cannot go; the delta can, then the base
        done = self.tenant("policy", "delete", "web@4")
        self.assertEqual(1, done.returncode)
        self.assertIn("409", done.stderr)
        self.assertIn(delta_digest, done.stderr)
        self.ok("policy", "show", "web@4")
        self.ok("policy", "delete", "web@5")
        self.ok("policy", "delete", "web@4")
        self.assertIn("no runtime policies", self.ok("policy", "list"))

    def test_a_delta_over_a_missing_base_is_404_naming_it(self) -> None:
        missing = "ab" * 32
        doc = {**DELTA, "name": "api", "base": missing}
        signature = self.key.sign(canonical_document(doc))
        with self.assertRaises(ServiceError) as ctx:
            self.api(lambda t: t.add_policy("runtime", doc, signature=signature))
        self.assertEqual(404, ctx.exception.status)
        self.assertEqual("unknown_policy", ctx.exception.code)
        self.assertIn(missing, str(ctx.exception))
        # through the CLI the reference does not resolve: one line, exit 1
        done = self.tenant(
            "policy", "add", self.write("d.json", DELTA), "--base", "api@1",
            "--sign-key", self.sign_key,
        )  # fmt: skip
        self.assertEqual(1, done.returncode)
        self.assertIn("404", done.stderr)
        self.assertEqual(1, len(done.stderr.strip().splitlines()))
        self.assertNotIn("'api'", self.ok("policy", "list"))

    def test_a_signature_without_the_base_is_refused(self) -> None:
        base = {**BASE, "name": "db"}
        self.ok(
            "policy", "add", self.write("db.json", base), "--sign-key", self.sign_key
        )
        base_digest = hashlib.sha256(canonical_document(base)).hexdigest()
        delta = {**DELTA, "name": "db"}
        with self.assertRaises(ServiceError) as ctx:  # signed without "base"
            self.api(
                lambda t: t.add_policy(
                    "runtime",
                    {**delta, "base": base_digest},
                    signature=self.key.sign(canonical_document(delta)),
                )
            )
        self.assertEqual(400, ctx.exception.status)
        self.assertEqual("policy_signature", ctx.exception.code)
        with self.assertRaises(ServiceError) as ctx:  # a delta of another name
            doc = {**DELTA, "base": base_digest}
            self.api(
                lambda t: t.add_policy(
                    "runtime", doc, signature=self.key.sign(canonical_document(doc))
                )
            )
        self.assertEqual(400, ctx.exception.status)
        self.assertIn("differs from its base's 'db'", str(ctx.exception))
        listed = self.ok("policy", "list")
        self.assertIn("db@4", listed)
        self.assertNotIn("db@5", listed)
        self.ok("policy", "delete", "db@4")
