"""``openstack attestation policy create --base REF`` against a real
Keystone (issue 28): a delta over a base of the user's project is stored
and shown with its base; a delta over another project's base is refused
exactly like one over a missing base (404), whether the reference is
resolved by the command or written in the file."""

from __future__ import annotations

import hashlib
import json
import os

from verifier.protocol.ima.policy import canonical_document
from verifier.tests.functional.tenancy_base import OpenStackCliCase

BASE = {
    "name": "web",
    "version": 4,
    "digests": {"/usr/bin/app": ["sha256:" + hashlib.sha256(b"app").hexdigest()]},
}
DELTA = {
    "name": "web",
    "version": 5,
    "digests": {"/usr/bin/new": ["sha256:" + hashlib.sha256(b"new").hexdigest()]},
}


class OpenStackPolicyDeltaTest(OpenStackCliCase):
    def write(self, name: str, document: dict[str, object]) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            json.dump(document, f)
        return path

    async def test_policy_create_base_is_scoped_to_the_project(self) -> None:
        base = await self.json_of("alice", "policy", "create", self.write("b", BASE))
        delta_file = self.write("d", DELTA)
        created = await self.json_of(
            "alice", "policy", "create", "--base", "web@4", delta_file
        )
        self.assertEqual(("web", 5), (created["name"], created["version"]))
        shown = await self.json_of("alice", "policy", "show", "web")
        self.assertEqual(f"web@4 ({base['digest']})", shown["base"])
        self.assertEqual(base["digest"], shown["policy"]["base"])

        # bob's project has no web@4: the reference does not resolve
        code, _, err = await self.openstack(
            "bob", "policy", "create", "--base", "web@4", delta_file
        )
        self.assertEqual(1, code)
        self.assertIn("unknown_policy", err)
        self.assertNotIn("Traceback", err)
        # nor does alice's base digest written in the file: 404 naming it
        named = self.write("n", {**DELTA, "base": base["digest"]})
        code, _, err = await self.openstack("bob", "policy", "create", named)
        self.assertEqual(1, code)
        self.assertIn("unknown_policy", err)
        self.assertIn(base["digest"], err)
        self.assertEqual([], await self.json_of("bob", "policy", "list"))
        # a file naming another base than --base: refused before sending
        other = self.write("o", {**DELTA, "base": "ab" * 32})
        code, _, err = await self.openstack(
            "alice", "policy", "create", "--base", "web@4", other
        )
        self.assertEqual(1, code)
        self.assertIn("ab" * 32, err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(
            hashlib.sha256(
                canonical_document({**DELTA, "base": base["digest"]})
            ).hexdigest(),
            created["digest"],
        )
