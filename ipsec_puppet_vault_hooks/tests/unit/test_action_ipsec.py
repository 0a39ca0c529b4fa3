"""Tests of the ``ipsec`` action's CRL, peer mappings and bad input.

What needs charon is in ``tests/functional/test_ipsec_strongswan.py``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import uuid

import fixtures
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import ActionError, load_actions
from ipsec_puppet_vault_hooks._ipsec import crl as crl_mod
from ipsec_puppet_vault_hooks._ipsec import peers as peers_mod
from ipsec_puppet_vault_hooks.actions.ipsec import IpsecAction
from trusted_testing import hooks_events as utils
from verifier.ca import CertificateAuthority

_DAY = datetime.timedelta(days=1)


class CrlTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.ca = CertificateAuthority.create(os.path.join(self.tmp, "ca"), "CA")
        self.issuer = crl_mod.CrlIssuer.from_files(
            os.path.join(self.tmp, "ca", "ca.pem"),
            os.path.join(self.tmp, "ca", "ca-key.pem"),
            _DAY,
        )
        self.path = os.path.join(self.tmp, "ca.crl")

    def _number(self, crl: x509.CertificateRevocationList) -> int:
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number

    def test_first_revocation_creates_a_signed_crl(self) -> None:
        pem, changed = self.issuer.revoke(self.path, 1234)
        self.assertTrue(changed)
        crl = crl_mod.load_crl(self.path)
        assert crl is not None
        self.assertEqual(pem, open(self.path, "rb").read())
        self.assertTrue(crl.is_signature_valid(self.ca.cert.public_key()))  # type: ignore[arg-type]
        self.assertEqual(self.ca.cert.subject, crl.issuer)
        self.assertEqual([1234], [r.serial_number for r in crl])
        self.assertEqual(1, self._number(crl))
        assert crl.next_update_utc is not None
        self.assertEqual(_DAY, crl.next_update_utc - crl.last_update_utc)
        # strongSwan looks the CRL up by the issuer's key id.
        aki = crl.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
        ski = x509.SubjectKeyIdentifier.from_public_key(self.ca.cert.public_key())  # type: ignore[arg-type]
        self.assertEqual(ski.digest, aki.value.key_identifier)

    def test_revoking_again_changes_nothing(self) -> None:
        first, _ = self.issuer.revoke(self.path, 1234)
        again, changed = self.issuer.revoke(self.path, 1234)
        self.assertFalse(changed)
        self.assertEqual(first, again)

    def test_second_serial_is_added_and_number_raised(self) -> None:
        self.issuer.revoke(self.path, 1)
        self.issuer.revoke(self.path, 2)
        crl = crl_mod.load_crl(self.path)
        assert crl is not None
        self.assertEqual([1, 2], sorted(r.serial_number for r in crl))
        self.assertEqual(2, self._number(crl))

    def test_crl_of_another_ca_is_refused(self) -> None:
        other = CertificateAuthority.create(os.path.join(self.tmp, "other"), "CA")
        other_issuer = crl_mod.CrlIssuer(other.cert, other._key, _DAY)
        other_issuer.revoke(self.path, 1)
        exc = self.assertRaises(crl_mod.CrlError, self.issuer.revoke, self.path, 2)
        self.assertIn("not issued by the configured CA", str(exc))

    def test_garbage_crl_file_is_named(self) -> None:
        with open(self.path, "wb") as f:
            f.write(b"not a crl")
        exc = self.assertRaises(crl_mod.CrlError, self.issuer.revoke, self.path, 2)
        self.assertIn(self.path, str(exc))

    def test_key_must_match_certificate(self) -> None:
        exc = self.assertRaises(
            crl_mod.CrlError,
            crl_mod.CrlIssuer,
            self.ca.cert,
            ec.generate_private_key(ec.SECP256R1()),
            _DAY,
        )
        self.assertIn("does not belong", str(exc))

    def test_missing_ca_key_is_named(self) -> None:
        missing = os.path.join(self.tmp, "nope.pem")
        exc = self.assertRaises(
            crl_mod.CrlError,
            crl_mod.CrlIssuer.from_files,
            os.path.join(self.tmp, "ca", "ca.pem"),
            missing,
            _DAY,
        )
        self.assertIn(missing, str(exc))


class PeersTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.node = str(uuid.uuid4())

    def _write(self, node: str, body: object) -> None:
        with open(os.path.join(self.dir, f"{node}.json"), "w") as f:
            json.dump(body, f)

    def test_no_mapping_is_none(self) -> None:
        self.assertIsNone(peers_mod.load_peer(self.dir, self.node))

    def test_serial_from_certificate_and_default_connection(self) -> None:
        ca = CertificateAuthority.create(os.path.join(self.dir, "ca"), "CA")
        _key, cert = ca.issue(self.node, [])
        with open(os.path.join(self.dir, "node.pem"), "wb") as f:
            f.write(cert)
        self._write(self.node, {"certificate": "node.pem"})
        peer = peers_mod.load_peer(self.dir, self.node)
        assert peer is not None
        self.assertEqual(self.node, peer.connection)
        self.assertEqual(
            x509.load_pem_x509_certificate(cert).serial_number, peer.serial
        )

    def test_serial_in_hex(self) -> None:
        self._write(self.node, {"connection": "n1", "serial": "0a:ff"})
        peer = peers_mod.load_peer(self.dir, self.node)
        assert peer is not None
        self.assertEqual(("n1", 0x0AFF), (peer.connection, peer.serial))

    def test_malformed_mappings_are_named(self) -> None:
        cases = [
            ({"connection": "n1"}, "'certificate' or 'serial'"),
            ({"serial": "zz"}, "'certificate' or 'serial'"),
            ({"serial": "01", "connection": "bad name"}, "bad connection name"),
            ({"serial": "01", "swanctl": {"bad key": 1}}, "bad swanctl key"),
            ({"serial": "01", "swanctl": {"k": 'a"b'}}, "unusable value"),
            ({"certificate": "missing.pem"}, "missing.pem"),
            (["not", "an", "object"], "JSON object"),
        ]
        for body, message in cases:
            self._write(self.node, body)
            exc = self.assertRaises(
                peers_mod.PeerError, peers_mod.load_peer, self.dir, self.node
            )
            self.assertIn(message, str(exc))
            self.assertIn(self.node, str(exc))

    def test_load_peers_skips_other_files(self) -> None:
        other = str(uuid.uuid4())
        self._write(self.node, {"serial": "01"})
        self._write(other, {"serial": "02"})
        with open(os.path.join(self.dir, "README"), "w") as f:
            f.write("not a mapping")
        peers = peers_mod.load_peers(self.dir)
        self.assertEqual(sorted([self.node, other]), [p.node_uuid for p in peers])

    def test_render_swanctl(self) -> None:
        text = peers_mod.render_swanctl(
            [
                (
                    "n1",
                    {
                        "version": 2,
                        "encap": True,
                        "remote_addrs": ["192.0.2.1", "192.0.2.2"],
                        "remote": {"id": "CN=n1, O=x"},
                    },
                )
            ]
        )
        self.assertEqual(
            "# Written by the trusted-cloud ipsec revocation action.\n"
            "connections {\n"
            "    n1 {\n"
            "        version = 2\n"
            "        encap = yes\n"
            "        remote_addrs = 192.0.2.1, 192.0.2.2\n"
            "        remote {\n"
            '            id = "CN=n1, O=x"\n'
            "        }\n"
            "    }\n"
            "}\n",
            text,
        )


class IpsecActionBadInputTestCase(base.BaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.logger = self.useFixture(fixtures.FakeLogger(level=logging.INFO))
        CertificateAuthority.create(os.path.join(self.tmp, "ca"), "CA")
        self.peers = os.path.join(self.tmp, "peers")
        os.mkdir(self.peers)
        self.crl = os.path.join(self.tmp, "ca.crl")
        self.conf = cfg.ConfigOpts()
        self.action = IpsecAction(self.conf)
        for name, value in {
            "peers_dir": self.peers,
            "ca_cert": os.path.join(self.tmp, "ca", "ca.pem"),
            "ca_key": os.path.join(self.tmp, "ca", "ca-key.pem"),
            "crl_file": self.crl,
            "vici_socket": os.path.join(self.tmp, "charon.vici"),
            "vici_timeout": 2.0,
        }.items():
            self.conf.set_override(name, value, group="action_ipsec")
        self.conf([])
        self.event = utils.make_event(ed25519.Ed25519PrivateKey.generate()).event

    def _map(self, body: object) -> None:
        with open(os.path.join(self.peers, f"{self.event.node_uuid}.json"), "w") as f:
            json.dump(body, f)

    def test_unknown_node_is_logged_and_succeeds(self) -> None:
        self.action.handle(self.event)
        self.action.handle(self.event)
        self.assertIn(
            f"Node {self.event.node_uuid} has no IPsec peer mapping",
            self.logger.output,
        )
        self.assertFalse(os.path.exists(self.crl))

    def test_charon_down_raises_action_error_and_keeps_the_crl(self) -> None:
        self._map({"serial": "2a"})
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertEqual("ipsec", exc.action)
        self.assertIn("cannot reach charon at", exc.detail)
        self.assertIn("charon.vici", exc.detail)
        # The CRL is already written, so the retry only has to load it.
        crl = crl_mod.load_crl(self.crl)
        assert crl is not None
        self.assertEqual([0x2A], [r.serial_number for r in crl])

    def test_socket_nobody_answers(self) -> None:
        self._map({"serial": "2a"})
        path = os.path.join(self.tmp, "dead.vici")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)  # bound but not listening: connection refused
        self.addCleanup(sock.close)
        self.conf.set_override("vici_socket", path, group="action_ipsec")
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("cannot reach charon", exc.detail)

    def test_malformed_mapping_raises_action_error(self) -> None:
        self._map({"connection": "n1"})
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("'certificate' or 'serial'", exc.detail)

    def test_missing_options_are_named(self) -> None:
        self.conf.clear_override("ca_key", group="action_ipsec")
        self.conf.clear_override("crl_file", group="action_ipsec")
        exc = self.assertRaises(ActionError, self.action.handle, self.event)
        self.assertIn("[action_ipsec] ca_key, [action_ipsec] crl_file", exc.detail)

    def test_loaded_by_name(self) -> None:
        (action,) = load_actions(cfg.ConfigOpts(), ["ipsec"])
        self.assertIsInstance(action, IpsecAction)
