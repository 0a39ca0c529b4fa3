"""``[keystone_authtoken]`` as doc/source/admin/tenancy.rst documents it,
against a real Keystone (issue 33):

* the page's example block, as written (host names and password aside),
  lets a member in; the old one (``memcached_servers`` without the module
  it needs, and an inline comment) answered every request with HTTP 500;
* a Keystone that accepts connections and never answers gives ``503
  auth_unavailable`` under the services' default timeout instead of
  holding the request for ever;
* a token revoked in Keystone stops working within ``token_cache_time``.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from oslo_config import cfg

from verifier import conf as vconf
from verifier.api.authz import Auth
from verifier.api.keystone import MIDDLEWARE_DEFAULTS, KeystoneAuthenticator
from verifier.api.verifier_app import make_app
from verifier.exceptions import ConfigError
from verifier.policies import make_enforcer
from verifier.tests.functional.tenancy_base import KeystoneTestBase

PAGE = os.path.join(
    os.path.dirname(__file__),
    "..", "..", "..", "doc", "source", "admin", "tenancy.rst",
)  # fmt: skip
#: Guards against a hung test only; nothing asserts on time.
_GUARD = 120.0


def page_example() -> str:
    """The ``[verifier]``/``[keystone_authtoken]`` literal block of the
    page, dedented."""
    with open(PAGE) as f:
        text = f.read()
    block = re.search(r"\n( +)\[verifier\]\n(?:\1.*\n|\n)+", text)
    assert block is not None, "no [verifier] block in tenancy.rst"
    indent = block.group(1)
    lines = [line.removeprefix(indent) for line in block.group(0).splitlines()]
    return "\n".join(lines).strip() + "\n"


class _HungServer:
    """A loopback TCP server that accepts and never answers; records
    whether each connection was closed by the client."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = int(self._sock.getsockname()[1])
        self.accepted = 0
        self.closed_by_client = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                if not data:  # the client gave up
                    with self._lock:
                        self.closed_by_client += 1
                    return

    def close(self) -> None:
        self._sock.close()


class KeystoneSettingsTest(KeystoneTestBase):
    async def serve(self, conf: cfg.ConfigOpts) -> TestServer:
        auth = Auth(make_enforcer(conf), KeystoneAuthenticator(conf))
        server = TestServer(make_app(self.verifier, "PEM", auth), host="127.0.0.1")
        await server.start_server()
        self.addAsyncCleanup(server.close)
        return server

    async def get_nodes(self, server: TestServer, token: str) -> tuple[int, Any]:
        timeout = aiohttp.ClientTimeout(total=_GUARD)
        url = str(server.make_url("/v1/nodes"))
        headers = {"X-Auth-Token": token}
        async with self.http.get(url, headers=headers, timeout=timeout) as resp:
            return resp.status, await resp.json()

    def conf_from(self, text: str) -> cfg.ConfigOpts:
        path = os.path.join(self.tmp, "example.conf")
        with open(path, "w") as f:
            f.write(text)
        conf = cfg.ConfigOpts()
        vconf.register_opts(conf)
        conf(["--config-file", path], project="trusted-cloud")
        return conf

    # -- the page's example --------------------------------------------

    async def test_the_pages_example_works_as_written(self) -> None:
        text = page_example()
        self.assertIn("[keystone_authtoken]", text)
        for line in text.splitlines():  # install.rst: comments on their own lines
            if "#" in line:
                self.assertTrue(line.lstrip().startswith("#"), line)
        text = text.replace(
            "https://keystone.example.net/identity/v3", self.keystone.url
        )
        text = text.replace("password = ...", "password = attestation-secret")
        conf = self.conf_from(text)
        server = await self.serve(conf)
        self.assertEqual(60, conf.keystone_authtoken.token_cache_time)
        await self.enrol_node("alice")
        status, body = await self.get_nodes(server, self.tokens["alice"])
        self.assertEqual(200, status, body)
        self.assertEqual(1, len(body["nodes"]))

    def test_memcached_without_its_client_is_a_configuration_error(self) -> None:
        conf = self.service_conf(extra="memcached_servers = 127.0.0.1:11211\n")
        with self.assertRaises(ConfigError) as caught:
            KeystoneAuthenticator(conf)
        self.assertIn(
            "memcached_servers needs the python-memcached package",
            str(caught.exception),
        )

    # -- a Keystone that does not answer ---------------------------------

    def test_the_services_set_a_timeout_by_default(self) -> None:
        conf = self.service_conf()
        KeystoneAuthenticator(conf)
        group = conf.keystone_authtoken
        self.assertEqual(10, group.http_connect_timeout)
        self.assertEqual(1, group.http_request_max_retries)
        self.assertEqual(
            {"http_connect_timeout": 10, "http_request_max_retries": 1},
            MIDDLEWARE_DEFAULTS,
        )

    async def test_a_hung_keystone_gives_503_under_the_configured_timeout(
        self,
    ) -> None:
        hung = _HungServer()
        self.addCleanup(hung.close)
        conf = self.service_conf(
            auth_url=f"http://127.0.0.1:{hung.port}/v3",
            extra="http_connect_timeout = 1\nhttp_request_max_retries = 0\n",
        )
        server = await self.serve(conf)
        status, body = await self.get_nodes(server, self.tokens["alice"])
        self.assertEqual(503, status, body)
        self.assertEqual("auth_unavailable", body["error"]["code"])
        # the service gave up on Keystone (the server never answers or
        # closes): its timeout applied, on each connection it opened
        for _ in range(100):
            if hung.closed_by_client == hung.accepted:
                break
            await asyncio.sleep(0.1)
        self.assertGreater(hung.accepted, 0)
        self.assertEqual(hung.accepted, hung.closed_by_client)

    # -- revoked tokens ---------------------------------------------------

    async def revoked_after_use(self, cache_time: int) -> tuple[TestServer, str]:
        conf = self.service_conf(extra=f"token_cache_time = {cache_time}\n")
        server = await self.serve(conf)
        token = self.keystone.user_token(self.users["alice"])
        status, body = await self.get_nodes(server, token)
        self.assertEqual(200, status, body)  # validated (and cached)
        self.keystone.revoke_token(token)
        return server, token

    async def test_a_revoked_token_stops_working_within_token_cache_time(
        self,
    ) -> None:
        server, token = await self.revoked_after_use(5)
        statuses = []
        for _ in range(int(_GUARD)):  # poll: the cache expires in 5 s
            status, _ = await self.get_nodes(server, token)
            statuses.append(status)
            if status == 401:
                break
            await asyncio.sleep(1.0)
        self.assertEqual(401, statuses[-1], statuses)
        self.assertTrue(all(s == 200 for s in statuses[:-1]), statuses)

    async def test_without_the_cache_a_revoked_token_is_refused_at_once(
        self,
    ) -> None:
        server, token = await self.revoked_after_use(-1)
        status, body = await self.get_nodes(server, token)
        self.assertEqual(401, status, body)
