"""Tests of the ``puppet`` action against a real HTTPS server (mutual TLS)
that plays puppetserver's CA API and PuppetDB's command API.

The real puppetserver 7.9.5 runs in
``ipsec_puppet_vault_hooks.tests.functional.test_puppet``; PuppetDB does
not run on this machine, so its command is checked here, on the wire.
"""

from __future__ import annotations

import urllib.parse

import fixtures
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import ActionError
from ipsec_puppet_vault_hooks.actions.puppet import PuppetAction
from trusted_testing import hooks_events as utils
from trusted_testing.cluster import free_port
from trusted_testing.https_server import HttpsServer, Pki, Seen

STATUS = "/puppet-ca/v1/certificate_status/"


class FakeCa:
    """Certificate states by certname, changed as puppetserver does."""

    def __init__(self, states: dict[str, str]) -> None:
        self.states = states
        self.put_status = 204

    def __call__(self, seen: Seen) -> tuple[int, object]:
        if seen.path.startswith("/pdb/cmd/v1"):
            return 200, {"uuid": "d2b4d5a6-0000-4000-8000-000000000000"}
        certname = urllib.parse.unquote(seen.path[len(STATUS) :])
        state = self.states.get(certname)
        if seen.method == "GET":
            if state is None:
                return 404, None
            return 200, {"name": certname, "state": state}
        if seen.method == "DELETE":
            self.states.pop(certname, None)
            return 204, None
        if state != "signed":
            return 409, None
        if self.put_status == 204:
            self.states[certname] = seen.json()["desired_state"]
        return self.put_status, None


class _ActionTestBase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.pki = Pki(self.useFixture(fixtures.TempDir()).path)
        self.event = utils.make_event(ed25519.Ed25519PrivateKey.generate()).event
        self.certname = self.event.node_uuid
        self.ca = FakeCa({self.certname: "signed"})
        self.server = HttpsServer(self.pki, self.ca)
        self.addCleanup(self.server.stop)
        self.conf = cfg.ConfigOpts()
        self.action = PuppetAction(self.conf)
        self.conf([])
        self._set(
            server_url=self.server.url,
            cert_file=self.pki.cert_file,
            key_file=self.pki.key_file,
            ca_file=self.pki.ca_file,
        )

    def _set(self, **kw: object) -> None:
        for key, value in kw.items():
            self.conf.set_override(key, value, group="action_puppet")

    def _methods(self) -> list[tuple[str, str]]:
        return [(s.method, s.path) for s in self.server.seen]


class PuppetActionTestCase(_ActionTestBase):
    def test_signed_certificate_is_revoked(self) -> None:
        self.action.handle(self.event)
        self.assertEqual("revoked", self.ca.states[self.certname])
        self.assertEqual(
            [("GET", STATUS + self.certname), ("PUT", STATUS + self.certname)],
            self._methods(),
        )
        put = self.server.seen[1]
        self.assertEqual({"desired_state": "revoked"}, put.json())
        self.assertEqual("application/json", put.content_type)
        self.assertEqual("revocation-hook", put.client_cn)

    def test_revoking_twice_is_idempotent(self) -> None:
        self.action.handle(self.event)
        self.action.handle(self.event)
        self.assertEqual("revoked", self.ca.states[self.certname])
        self.assertEqual(1, [s.method for s in self.server.seen].count("PUT"))

    def test_unknown_certificate_is_nothing_to_revoke(self) -> None:
        self.ca.states.clear()
        self.action.handle(self.event)
        self.assertEqual([("GET", STATUS + self.certname)], self._methods())

    def test_pending_request_is_deleted(self) -> None:
        self.ca.states[self.certname] = "requested"
        self.action.handle(self.event)
        self.assertNotIn(self.certname, self.ca.states)
        self.assertEqual("DELETE", self.server.seen[-1].method)

    def test_certname_template(self) -> None:
        self._set(certname_template="{uuid}.nodes.example.org")
        certname = f"{self.event.node_uuid}.nodes.example.org"
        self.ca.states = {certname: "signed"}
        self.action.handle(self.event)
        self.assertEqual("revoked", self.ca.states[certname])

    def test_bad_certname_template_is_an_action_error(self) -> None:
        self._set(certname_template="node-{id}")
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("{uuid}", exc.detail)

    def test_missing_options_are_an_action_error(self) -> None:
        self.conf.clear_override("cert_file", group="action_puppet")
        exc = self.assertRaises(ActionError, PuppetAction(self.conf).handle, self.event)
        self.assertIn("cert_file", exc.detail)

    def test_server_down_is_an_action_error(self) -> None:
        self._set(server_url=f"https://127.0.0.1:{free_port()}")
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertEqual("puppet", exc.action)
        self.assertIn("refused", exc.detail.lower())

    def test_forbidden_names_auth_conf(self) -> None:
        self.server.handler = lambda seen: (403, None)
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("auth.conf", exc.detail)

    def test_server_error_is_an_action_error_and_changes_nothing(self) -> None:
        self.ca.put_status = 500
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("500", exc.detail)
        self.assertEqual("signed", self.ca.states[self.certname])

    def test_concurrent_revocation_is_success(self) -> None:
        def handler(seen: Seen) -> tuple[int, object]:
            if seen.method == "PUT":  # someone else revoked it just now
                self.ca.states[self.certname] = "revoked"
                return 409, None
            return self.ca(seen)

        self.server.handler = handler
        self.action.handle(self.event)

    def test_untrusted_server_is_an_action_error(self) -> None:
        other = Pki(self.useFixture(fixtures.TempDir()).path)
        self._set(ca_file=other.ca_file)
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("CERTIFICATE_VERIFY_FAILED", exc.detail)


class PuppetDbTestCase(_ActionTestBase):
    """The same, with PuppetDB deactivation configured."""

    def setUp(self) -> None:
        super().setUp()
        self._set(puppetdb_url=self.server.url + "/")

    def _commands(self) -> list[Seen]:
        return [s for s in self.server.seen if s.path.startswith("/pdb/")]

    def test_node_is_deactivated_after_revocation(self) -> None:
        self.action.handle(self.event)
        (command,) = self._commands()
        self.assertEqual("POST", command.method)
        path, _, query = command.path.partition("?")
        self.assertEqual("/pdb/cmd/v1", path)
        self.assertEqual(
            {
                "command": ["deactivate node"],
                "version": ["3"],
                "certname": [self.certname],
            },
            urllib.parse.parse_qs(query),
        )
        self.assertEqual(
            {"certname": self.certname, "producer_timestamp": self.event.created_at},
            command.json(),
        )
        self.assertEqual("application/json", command.content_type)
        self.assertEqual("PUT", self.server.seen[-2].method)  # revoked first

    def test_repeat_sends_the_same_command(self) -> None:
        self.action.handle(self.event)
        self.action.handle(self.event)
        first, second = self._commands()
        self.assertEqual(first.body, second.body)

    def test_puppetdb_error_is_an_action_error(self) -> None:
        def handler(seen: Seen) -> tuple[int, object]:
            if seen.path.startswith("/pdb/"):
                return 503, {"error": "queue full"}
            return self.ca(seen)

        self.server.handler = handler
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("PuppetDB answered 503", exc.detail)
        self.assertEqual("revoked", self.ca.states[self.certname])

    def test_puppetdb_down_is_an_action_error(self) -> None:
        self._set(puppetdb_url=f"https://127.0.0.1:{free_port()}")
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("/pdb/cmd/v1", exc.detail)
