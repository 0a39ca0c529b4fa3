"""The ``ipsec`` action against real strongSwan charons.

A hub and one or two nodes, each a charon in its own network namespace
(userspace ESP through kernel-libipsec); certificates from our software CA
with CN = node UUID; the hub provisioned from a swanctl directory with
``swanctl --load-all``, as an operator would.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import fixtures
import vici.exception
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks import Consumer
from ipsec_puppet_vault_hooks import conf as hooks_conf
from ipsec_puppet_vault_hooks._ipsec import crl as crl_mod
from ipsec_puppet_vault_hooks.actions.ipsec import IpsecAction
from trusted_testing.strongswan import Lab, Site
from verifier.protocol import RevocationEvent


def _event(node_uuid: str) -> RevocationEvent:
    return RevocationEvent(
        id=str(uuid.uuid4()),
        node_uuid=node_uuid,
        reason="pcr_policy",
        detail="PCR 16 does not match the policy",
        created_at="2026-11-22T05:00:00Z",
    )


class _LabTest(base.BaseTestCase):
    spokes = 1
    lab: Lab
    site: Site

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.lab = Lab(spokes=cls.spokes)
        cls.addClassCleanup(cls.lab.close)
        cls.lab.start()
        cls.site = Site(cls.lab)
        cls.site.load_hub()

    def _conf(self, **overrides: Any) -> cfg.ConfigOpts:
        conf = cfg.ConfigOpts()
        IpsecAction(conf)  # registers [action_ipsec]
        for name, value in {**self.site.action_settings(), **overrides}.items():
            conf.set_override(name, value, group="action_ipsec")
        return conf

    def _up(self, i: int) -> None:
        if not self.lab.charons[f"node{i}"].ike_sas("hub"):
            self.lab.charons[f"node{i}"].initiate("hub")

    def _esp_bytes(self, i: int) -> int:
        sas = self.lab.charons["hub"].ike_sas(f"node{i}")
        return sum(
            int(child["bytes-in"])
            for sa in sas.values()
            for child in sa.get("child-sas", {}).values()
        )

    def assert_tunnel_works(self, i: int) -> None:
        self._up(i)
        before = self._esp_bytes(i)
        self.assertTrue(self.lab.ping(i), f"node{i} cannot ping the hub")
        self.assertGreater(self._esp_bytes(i), before, "the ping bypassed ESP")

    def assert_refused_as_revoked(self, i: int) -> None:
        hub = self.lab.charons["hub"]
        self.assertRaises(
            vici.exception.CommandException,
            self.lab.charons[f"node{i}"].initiate,
            "hub",
        )
        self.assertIn("certificate was revoked", hub.log_text())
        self.assertEqual({}, hub.ike_sas(f"node{i}"))
        self.assertFalse(self.lab.ping(i, wait=1))


class StrongswanRevocationTest(_LabTest):
    """Hub and two nodes; node 1 is revoked, node 2 must not notice."""

    spokes = 2

    def _action(self, **overrides: Any) -> IpsecAction:
        conf = self._conf(**overrides)
        conf([])
        return IpsecAction(conf)

    def test_unknown_node_changes_nothing(self) -> None:
        hub = self.lab.charons["hub"]
        before = hub.conns()
        crl_file = os.path.join(self.lab.workdir, "unknown.crl")
        self._action(crl_file=crl_file).handle(_event(str(uuid.uuid4())))
        self.assertFalse(os.path.exists(crl_file))
        self.assertEqual(before, hub.conns())

    def test_revocation_cuts_off_only_the_revoked_node(self) -> None:
        hub, site = self.lab.charons["hub"], self.site
        for i in (1, 2):
            self.assert_tunnel_works(i)
        node2_sa = set(hub.ike_sas("node2"))
        self.assertEqual(1, len(node2_sa))

        self._action().handle(_event(site.uuids[1]))

        # Node 1 is cut off on both ends and its tunnel carries nothing.
        self.assertEqual({}, hub.ike_sas("node1"))
        self.assertEqual({}, self.lab.charons["node1"].ike_sas("hub"))
        self.assertNotIn("node1", hub.conns())
        self.assertFalse(self.lab.ping(1, wait=1))
        # Node 2 keeps the very same SA and its pings still cross it.
        self.assertEqual(node2_sa, set(hub.ike_sas("node2")))
        self.assert_tunnel_works(2)
        # The CRL lists node 1's serial only, and charon holds it.
        crl = crl_mod.load_crl(site.crl_file)
        assert crl is not None
        self.assertEqual([site.serials[1]], [r.serial_number for r in crl])
        with hub.session() as s:
            self.assertEqual(1, len(list(s.list_certs({"type": "x509crl"}))))

        # What a reboot does: swanctl --load-all loads the regenerated
        # configuration (node 2 only) and the CRL; node 2's SA survives.
        site.load_hub()
        self.assertEqual({"node2"}, hub.conns())
        self.assertEqual(node2_sa, set(hub.ike_sas("node2")))

        # Even with its old connection restored, node 1 cannot come back.
        self.lab.swanctl("hub", "--load-conns", "--file", site.initial_conf)
        self.assertEqual({"node1", "node2"}, hub.conns())
        self.assert_refused_as_revoked(1)

        # A second delivery changes nothing and succeeds (it unloads the
        # restored connection again, as the first one did).
        with open(site.crl_file, "rb") as f:
            crl_bytes = f.read()
        self._action().handle(_event(site.uuids[1]))
        with open(site.crl_file, "rb") as f:
            self.assertEqual(crl_bytes, f.read())
        self.assertEqual({"node2"}, hub.conns())
        self.assertEqual(node2_sa, set(hub.ike_sas("node2")))
        self.assert_tunnel_works(2)


class StrongswanCharonDownTest(_LabTest):
    """The revocation arrives through the real consumer while the hub's
    charon is down; the consumer retries and nothing is lost."""

    def test_charon_down_is_retried_until_it_is_back(self) -> None:
        hub, site = self.lab.charons["hub"], self.site
        self.assert_tunnel_works(1)
        logger = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        key = ed25519.Ed25519PrivateKey.generate()
        pub = os.path.join(self.lab.workdir, "verifier-pub.pem")
        with open(pub, "wb") as f:
            f.write(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                )
            )
        conf = self._conf()
        hooks_conf.register_opts(conf)
        conf.set_override("actions", ["ipsec"], group="revocation_hooks")
        conf.set_override("verifier_public_key", pub, group="revocation_hooks")
        conf.set_override("max_attempts", 3, group="revocation_hooks")
        conf([])
        hub.stop()
        sleeps: list[float] = []

        def charon_comes_back(delay: float) -> None:
            # Between the consumer's first and second attempt: charon
            # restarts and loads its configuration as at boot. The CRL the
            # failed attempt wrote is already in x509crl/, so node 1 is
            # refused even before the retry runs.
            sleeps.append(delay)
            if len(sleeps) == 1:
                hub.start()
                site.load_hub()
                self.assertIn("node1", hub.conns())
                self.assert_refused_as_revoked(1)

        consumer = Consumer.from_conf(conf, sleep=charon_comes_back)
        result = consumer.consume(_event(site.uuids[1]).sign(key).to_dict())

        self.assertTrue(result.acked)
        self.assertEqual((), result.dead_lettered)
        self.assertEqual(1, len(sleeps))
        self.assertIn("cannot reach charon at", logger.output)
        self.assertEqual(set(), hub.conns())
        self.assertEqual({}, hub.ike_sas())
        with open(site.swanctl_conf) as f:
            self.assertNotIn("node1", f.read())
        self.assert_refused_as_revoked(1)


class StrongswanSilentNodeTest(_LabTest):
    """A compromised node may never answer the hub's DELETE."""

    def test_node_that_ignores_delete_is_still_cut_off(self) -> None:
        hub, node = self.lab.charons["hub"], self.lab.charons["node1"]
        self.assert_tunnel_works(1)
        assert node.proc is not None
        node.proc.kill()  # gone without a word: no DELETE answered
        node.proc.wait(timeout=10)
        self.assertEqual(1, len(hub.ike_sas("node1")))
        conf = self._conf(terminate_timeout=500)
        conf([])
        IpsecAction(conf).handle(_event(self.site.uuids[1]))
        self.assertEqual({}, hub.ike_sas("node1"))
        self.assertEqual(set(), hub.conns())
