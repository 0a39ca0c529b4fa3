"""The ``trusted-verifier`` process with ``auth_strategy = keystone``.

A real Keystone (two projects), the Nova compute stand-in in its catalog
and the verifier as its own process (LocalCluster, no nodes): tenants
come with tokens and no certificate, the Nova listener's operator
certificate keeps its ``service`` role, and projects are isolated.
"""

from __future__ import annotations

import base64
import os
import tempfile
import uuid as uuid_mod
from typing import Any, ClassVar

import requests
import testtools

from trusted_testing.cluster import LocalCluster
from trusted_testing.keystone import Keystone, KeystoneUser, token_validator
from trusted_testing.nova.compute_standin import ComputeStandIn


class KeystoneVerifierProcessTest(testtools.TestCase):
    keystone: ClassVar[Keystone]
    nova: ClassVar[ComputeStandIn]
    cluster: ClassVar[LocalCluster]
    users: ClassVar[dict[str, KeystoneUser]]
    _tmp: ClassVar[tempfile.TemporaryDirectory[str]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory()
        ks = cls.keystone = Keystone(os.path.join(cls._tmp.name, "keystone"))
        ks.start()
        try:
            alpha, beta = ks.add_project("alpha"), ks.add_project("beta")
            service = ks.add_project("service")
            cls.users = {
                "alice": ks.add_user("alice", "alpha", alpha, ["member"]),
                "bob": ks.add_user("bob", "beta", beta, ["member"]),
            }
            ks.add_user("attestation", "service", service, ["service"])
            cls.nova = ComputeStandIn(token_validator(ks))
            ks.add_service("compute", "nova", cls.nova.url)
            authtoken = {
                "www_authenticate_uri": ks.url,
                "auth_url": ks.url,
                "auth_type": "password",
                "username": "attestation",
                "password": "attestation-secret",
                "project_name": "service",
                "user_domain_id": "default",
                "project_domain_id": "default",
                "interface": "public",
            }
            cls.cluster = LocalCluster(
                os.path.join(cls._tmp.name, "cluster"),
                nodes=0,
                verifier_options={"auth_strategy": "keystone"},
                verifier_sections={"keystone_authtoken": authtoken},
            )
            cls.cluster.start_services()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        if getattr(cls, "cluster", None) is not None:
            cls.cluster.stop()
        if getattr(cls, "nova", None) is not None:
            cls.nova.stop()
        cls.keystone.stop()
        cls._tmp.cleanup()
        super().tearDownClass()

    def call(
        self, method: str, path: str, who: str | None = None, cert: str | None = None,
        body: Any = None,
    ) -> requests.Response:  # fmt: skip
        headers = {}
        if who is not None:
            headers["X-Auth-Token"] = self.keystone.user_token(self.users[who])
        session = requests.Session()
        session.trust_env = False
        session.verify = self.cluster.pki_file("ca.pem")
        if cert is not None:
            session.cert = (
                self.cluster.pki_file(f"{cert}.pem"),
                self.cluster.pki_file(f"{cert}-key.pem"),
            )
        url = self.cluster.verifier_url + path
        return session.request(method, url, json=body, headers=headers, timeout=60)

    def test_tenants_use_tokens_and_are_isolated(self) -> None:
        uuid = str(uuid_mod.uuid4())
        self.nova.add_server(uuid, self.users["alice"].project_id)
        body = {
            "uuid": uuid,
            "v": base64.b64encode(bytes(32)).decode(),
            "u_commitment": base64.b64encode(bytes(32)).decode(),
            "await_instance": True,
            "policy": {"hash": "sha256", "pcrs": {"16": ["00" * 32]}},
        }
        resp = self.call("POST", "/v1/nodes", "bob", body=body)
        self.assertEqual(404, resp.status_code, resp.text)
        self.assertEqual("unknown_instance", resp.json()["error"]["code"])
        resp = self.call("POST", "/v1/nodes", "alice", body=body)
        self.assertEqual(201, resp.status_code, resp.text)
        self.assertEqual(404, self.call("GET", f"/v1/nodes/{uuid}", "bob").status_code)
        self.assertEqual(
            200, self.call("GET", f"/v1/nodes/{uuid}", "alice").status_code
        )
        # the Nova listener's certificate is a machine identity (service)
        resp = self.call("POST", f"/v1/nodes/{uuid}/instance-created", cert="operator")
        self.assertEqual(200, resp.status_code, resp.text)
        self.assertEqual("created", resp.json()["state"])

    def test_tenant_certificate_is_no_identity_with_keystone(self) -> None:
        resp = self.call("GET", "/v1/nodes", cert="tenant")
        self.assertEqual(401, resp.status_code)
        self.assertEqual("unauthorized", resp.json()["error"]["code"])
        self.assertTrue(resp.headers["WWW-Authenticate"].startswith("Keystone uri="))
