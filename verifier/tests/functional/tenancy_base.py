"""A real Keystone with two projects in front of the verifier's API.

One Keystone (PyPI ``keystone``, SQLite, fernet) per test process holds
projects ``alpha`` and ``beta``: ``alice`` (member), ``rita`` (reader)
and ``olga`` (``attestation_observer``, monitoring) in alpha, ``bob``
(member) in beta, the bootstrap ``admin``, and the
``attestation`` service user that keystonemiddleware authenticates as.
Nova's compute API is a stand-in in Keystone's catalog that validates
tokens with that Keystone and knows which project each server is in
(:mod:`trusted_testing.nova.compute_standin`). Each test gets a fresh
verifier (in-process aiohttp application with the
real :class:`~verifier.api.keystone.KeystoneAuthenticator` and policy
enforcer; fake registrar and agents from the unit tests) and sends real
tokens over HTTP.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import json
import os
import sys
import tempfile
import unittest
from typing import Any, ClassVar

import aiohttp
from aiohttp.test_utils import TestServer
from oslo_config import cfg

from trusted_testing.keystone import Keystone, KeystoneUser, token_validator
from trusted_testing.nova.compute_standin import ComputeStandIn
from verifier import conf as vconf
from verifier.api.authz import Auth
from verifier.api.keystone import KeystoneAuthenticator
from verifier.api.verifier_app import make_app
from verifier.attest.instances import NovaInstanceOwners
from verifier.common.http import AsyncClient
from verifier.policies import make_enforcer
from verifier.tests.unit.test_attest_service import FakeAgent, VerifierServiceBase

#: The Keystone of this test process, shared by the classes (~30 s to start)
_SHARED: dict[str, Any] = {}


def _stop_shared() -> None:
    _SHARED["nova"].stop()
    _SHARED["keystone"].stop()
    _SHARED["_tmp"].cleanup()


PCRS = {"hash": "sha256", "pcrs": {"16": ["00" * 32]}}


_OPENSTACK = os.path.join(os.path.dirname(sys.executable), "openstack")


def shared_keystone() -> dict[str, Any]:
    """The Keystone of this test process (started by the first caller):
    ``keystone``, ``nova`` (the compute stand-in in its catalog), ``users``
    (:class:`KeystoneUser` by name) and ``tokens`` (a project-scoped token
    by user name, ``admin`` too)."""
    if _SHARED:  # started by an earlier class of this process
        return dict(_SHARED)
    tmp = tempfile.TemporaryDirectory()
    ks = Keystone(os.path.join(tmp.name, "keystone"))
    try:
        ks.start()
        alpha, beta = ks.add_project("alpha"), ks.add_project("beta")
        service = ks.add_project("service")
        users = {
            "alice": ks.add_user("alice", "alpha", alpha, ["member"]),
            "rita": ks.add_user("rita", "alpha", alpha, ["reader"]),
            "bob": ks.add_user("bob", "beta", beta, ["member"]),
            # a monitoring operator (reads counters and metrics only)
            "olga": ks.add_user("olga", "alpha", alpha, ["attestation_observer"]),
            "attestation": ks.add_user("attestation", "service", service, ["service"]),
        }
        tokens = {name: ks.user_token(u) for name, u in users.items()}
        tokens["admin"] = ks.admin_token()
        nova = ComputeStandIn(token_validator(ks))
        ks.add_service("compute", "nova", nova.url)
    except BaseException:
        ks.stop()
        tmp.cleanup()
        raise
    _SHARED.update(keystone=ks, users=users, tokens=tokens, nova=nova, _tmp=tmp)
    atexit.register(_stop_shared)
    return dict(_SHARED)


class KeystoneTestBase(VerifierServiceBase):
    """Keystone per class; a verifier and an HTTP client per test."""

    keystone: ClassVar[Keystone]
    nova: ClassVar[ComputeStandIn]
    users: ClassVar[dict[str, KeystoneUser]]
    tokens: ClassVar[dict[str, str]]
    _tmp: ClassVar[tempfile.TemporaryDirectory[str]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        for name, value in shared_keystone().items():
            setattr(cls, name, value)

    def service_conf(
        self, auth_url: str | None = None, extra: str = ""
    ) -> cfg.ConfigOpts:
        """The verifier's configuration with ``[keystone_authtoken]``
        (``auth_url``: another Keystone than the test's; ``extra``: more
        lines of that group)."""
        path = os.path.join(self.tmp, "verifier.conf")
        with open(path, "w") as f:
            f.write(
                "[verifier]\nauth_strategy = keystone\n"
                "[keystone_authtoken]\n"
                f"www_authenticate_uri = {self.keystone.url}\n"
                f"auth_url = {auth_url or self.keystone.url}\n"
                "auth_type = password\n"
                "username = attestation\npassword = attestation-secret\n"
                "project_name = service\n"
                "user_domain_id = default\nproject_domain_id = default\n"
                "service_token_roles_required = true\ninterface = public\n" + extra
            )
        conf = cfg.ConfigOpts()
        vconf.register_opts(conf)
        conf(["--config-file", path], project="trusted-cloud")
        return conf

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.verifier = self.new_verifier()
        self.quiesce(self.verifier)
        conf = self.service_conf()
        self.auth = Auth(make_enforcer(conf), KeystoneAuthenticator(conf))
        self.instances = NovaInstanceOwners(AsyncClient(None, 30.0))
        app = make_app(self.verifier, "PEM", self.auth, instances=self.instances)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        self.http = aiohttp.ClientSession()

    async def asyncTearDown(self) -> None:
        await self.http.close()
        await self.server.close()
        await self.instances.close()
        await super().asyncTearDown()

    async def call(
        self,
        who: str | None,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
    ) -> tuple[int, Any]:
        """``method path`` as user ``who`` (None: no token); (status, JSON)."""
        headers = {}
        if token is None and who is not None:
            token = self.tokens[who]
        if token is not None:
            headers["X-Auth-Token"] = token
        url = str(self.server.make_url(path))
        async with self.http.request(method, url, json=body, headers=headers) as resp:
            data = None if resp.status == 204 else await resp.json()
            return resp.status, data

    def project_of(self, who: str) -> str:
        if who == "admin":
            return self.keystone.project_id("admin")
        return self.users[who].project_id

    async def enrol_node(self, who: str, **extra: Any) -> FakeAgent:
        """A registered agent (a server of ``who``'s project in Nova)
        enrolled by ``who`` (201 asserted)."""
        agent = self.new_agent()
        self.nova.add_server(agent.uuid, self.project_of(who))
        status, body = await self.call(
            who, "POST", "/v1/nodes", self.enrolment(agent.uuid, **extra)
        )
        self.assertEqual(201, status, body)
        return agent

    @staticmethod
    def enrolment(uuid: str, v: bytes = b"\x01" * 32, **extra: Any) -> dict[str, Any]:
        return {
            "uuid": uuid,
            "v": base64.b64encode(v).decode(),
            "u_commitment": base64.b64encode(bytes(32)).decode(),
            "policy": PCRS,
            **extra,
        }


__all__ = ["KeystoneTestBase", "shared_keystone", "unittest"]


class OpenStackCliCase(KeystoneTestBase):
    """The ``openstack`` CLI against the verifier under test, with the
    verifier in the catalog as the ``attestation`` service; each call runs
    ``openstack`` + :attr:`command` + its arguments as one of the users."""

    command: ClassVar[tuple[str, ...]] = ("attestation",)

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        url = str(self.server.make_url("")).rstrip("/")
        service = await asyncio.to_thread(
            self.keystone.add_service, "attestation", "trusted-cloud", url
        )
        self.addCleanup(self.keystone.delete_service, service)

    async def openstack(self, who: str, *argv: str) -> tuple[int, str, str]:
        user = self.users[who]
        env = dict(
            os.environ,
            OS_AUTH_URL=self.keystone.url,
            OS_USERNAME=user.name,
            OS_PASSWORD=user.password,
            OS_PROJECT_NAME=user.project_name,
            OS_USER_DOMAIN_ID="default",
            OS_PROJECT_DOMAIN_ID="default",
            OS_IDENTITY_API_VERSION="3",
            OS_INTERFACE="public",
        )
        env.pop("OS_CLOUD", None)
        proc = await asyncio.create_subprocess_exec(
            _OPENSTACK, *self.command, *argv,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def json_of(self, who: str, *argv: str) -> Any:
        code, out, err = await self.openstack(who, *argv, "-f", "json")
        self.assertEqual(0, code, err)
        return json.loads(out)
