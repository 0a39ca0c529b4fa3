"""The ``ipsec`` action against real strongSwan charons.

A hub and two nodes, each a charon in its own network namespace (userspace
ESP through kernel-libipsec), certificates from our software CA with
CN = node UUID. Both nodes' tunnels are up and carry pings; the action
revokes node 1; node 1 is cut off and cannot come back even when its old
connection is restored on the hub, while node 2's tunnel is untouched.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import vici.exception
from cryptography import x509
from oslo_config import cfg
from oslotest import base

from ipsec_puppet_vault_hooks._ipsec import crl as crl_mod
from ipsec_puppet_vault_hooks._ipsec.peers import render_swanctl
from ipsec_puppet_vault_hooks.actions.ipsec import IpsecAction
from ipsec_puppet_vault_hooks.tests.functional._strongswan import Lab
from verifier.ca import CertificateAuthority
from verifier.protocol import RevocationEvent


def _event(node_uuid: str) -> RevocationEvent:
    return RevocationEvent(
        id=str(uuid.uuid4()),
        node_uuid=node_uuid,
        reason="pcr_policy",
        detail="PCR 16 does not match the policy",
        created_at="2026-11-22T05:00:00Z",
    )


class StrongswanRevocationTest(base.BaseTestCase):
    """One lab (three charons) for the class; see the module docstring."""

    lab: Lab
    uuids: dict[int, str]
    serials: dict[int, int]
    pki: str
    peers_dir: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.lab = Lab(spokes=2)
        cls.addClassCleanup(cls.lab.close)
        cls.lab.start()
        cls.pki = os.path.join(cls.lab.workdir, "pki")
        cls.peers_dir = os.path.join(cls.lab.workdir, "peers")
        os.makedirs(cls.peers_dir)
        ca = CertificateAuthority.create(cls.pki, "Trusted Cloud IPsec test CA")
        key, cert = ca.issue("hub", [])
        hub_cert = os.path.join(cls.pki, "hub.pem")
        with open(hub_cert, "wb") as f:
            f.write(cert)
        cls.lab.charons["hub"].load_identity(ca.cert_pem, cert, key)
        cls.uuids, cls.serials, initial = {}, {}, []
        for i in (1, 2):
            node_uuid = cls.uuids[i] = str(uuid.uuid4())
            key, cert = ca.issue(node_uuid, [])
            cls.serials[i] = x509.load_pem_x509_certificate(cert).serial_number
            with open(os.path.join(cls.peers_dir, f"{node_uuid}.pem"), "wb") as f:
                f.write(cert)
            cls.lab.charons[f"node{i}"].load_identity(ca.cert_pem, cert, key)
            cls._load_node_conn(i, cert)
            mapping = {
                "connection": f"node{i}",
                "certificate": f"{node_uuid}.pem",
                "swanctl": cls._hub_conn(i, hub_cert),
            }
            with open(os.path.join(cls.peers_dir, f"{node_uuid}.json"), "w") as f:
                json.dump(mapping, f)
            initial.append((f"node{i}", mapping["swanctl"]))
        # The hub's configuration, as provisioning would write it (the
        # same renderer the action regenerates it with), loaded by swanctl.
        cls.initial_conf = os.path.join(cls.lab.workdir, "initial.conf")
        with open(cls.initial_conf, "w") as f:
            f.write(render_swanctl(initial))
        cls.lab.swanctl("hub", "--load-conns", "--file", cls.initial_conf)

    @classmethod
    def _hub_conn(cls, i: int, hub_cert: str) -> dict[str, Any]:
        return {
            "version": 2,
            "local_addrs": cls.lab.hub_outer(i),
            "remote_addrs": cls.lab.node_outer(i),
            "encap": True,
            "local": {"auth": "pubkey", "certs": hub_cert, "id": "CN=hub"},
            "remote": {"auth": "pubkey", "id": f"CN={cls.uuids[i]}"},
            "children": {
                f"node{i}": {
                    "local_ts": f"{cls.lab.HUB_INNER}/32",
                    "remote_ts": f"{cls.lab.node_inner(i)}/32",
                }
            },
        }

    @classmethod
    def _load_node_conn(cls, i: int, cert: bytes) -> None:
        conn = {
            "version": "2",
            "local_addrs": [cls.lab.node_outer(i)],
            "remote_addrs": [cls.lab.hub_outer(i)],
            "encap": "yes",
            "local": {"auth": "pubkey", "certs": [cert], "id": f"CN={cls.uuids[i]}"},
            "remote": {"auth": "pubkey", "id": "CN=hub"},
            "children": {
                "hub": {
                    "local_ts": [f"{cls.lab.node_inner(i)}/32"],
                    "remote_ts": [f"{cls.lab.HUB_INNER}/32"],
                }
            },
        }
        with cls.lab.charons[f"node{i}"].session() as s:
            s.load_conn({"hub": conn})

    def _action(self, **overrides: Any) -> IpsecAction:
        conf = cfg.ConfigOpts()
        action = IpsecAction(conf)
        settings = {
            "vici_socket": self.lab.charons["hub"].vici_socket,
            "peers_dir": self.peers_dir,
            "ca_cert": os.path.join(self.pki, "ca.pem"),
            "ca_key": os.path.join(self.pki, "ca-key.pem"),
            "crl_file": os.path.join(self.lab.workdir, "revoked.crl"),
            "swanctl_conf": os.path.join(self.lab.workdir, "trusted-peers.conf"),
            "terminate_timeout": 3000,
        }
        settings.update(overrides)
        for name, value in settings.items():
            conf.set_override(name, value, group="action_ipsec")
        conf([])
        return action

    def _child_bytes(self, charon: str, ike: str) -> int:
        sas = self.lab.charons[charon].ike_sas(ike)
        return sum(
            int(child["bytes-in"])
            for sa in sas.values()
            for child in sa.get("child-sas", {}).values()
        )

    def _up(self, i: int) -> None:
        if not self.lab.charons[f"node{i}"].ike_sas("hub"):
            self.lab.charons[f"node{i}"].initiate("hub")

    def test_unknown_node_changes_nothing(self) -> None:
        hub = self.lab.charons["hub"]
        before = hub.conns()
        crl_file = os.path.join(self.lab.workdir, "unknown.crl")
        self._action(crl_file=crl_file).handle(_event(str(uuid.uuid4())))
        self.assertFalse(os.path.exists(crl_file))
        self.assertEqual(before, hub.conns())

    def test_revocation_cuts_off_only_the_revoked_node(self) -> None:
        hub = self.lab.charons["hub"]
        # Before: both tunnels up, pings cross them (ESP byte counters grow).
        for i in (1, 2):
            self._up(i)
            self.assertTrue(self.lab.ping(i), f"node{i} cannot ping the hub")
            self.assertGreater(self._child_bytes("hub", f"node{i}"), 0)
        node2_sa = set(hub.ike_sas("node2"))
        self.assertEqual(1, len(node2_sa))

        started = time.monotonic()
        self._action().handle(_event(self.uuids[1]))
        self.elapsed = time.monotonic() - started

        # Node 1 is cut off on both ends and its tunnel carries nothing.
        self.assertEqual({}, hub.ike_sas("node1"))
        self.assertEqual({}, self.lab.charons["node1"].ike_sas("hub"))
        self.assertNotIn("node1", hub.conns())
        self.assertFalse(self.lab.ping(1))
        # Node 2 keeps the very same SA and its pings still cross.
        self.assertEqual(node2_sa, set(hub.ike_sas("node2")))
        self.assertTrue(self.lab.ping(2))
        # The CRL lists node 1's serial only, and charon holds it.
        crl = crl_mod.load_crl(os.path.join(self.lab.workdir, "revoked.crl"))
        assert crl is not None
        self.assertEqual([self.serials[1]], [r.serial_number for r in crl])
        with hub.session() as s:
            crls = list(s.list_certs({"type": "x509crl"}))
        self.assertEqual(1, len(crls))

        # The regenerated configuration keeps node 2 only; swanctl loads it.
        conf_path = os.path.join(self.lab.workdir, "trusted-peers.conf")
        self.lab.swanctl("hub", "--load-conns", "--file", conf_path)
        self.assertEqual({"node2"}, hub.conns())
        self.assertEqual(node2_sa, set(hub.ike_sas("node2")))

        # Even with its old connection restored on the hub, node 1 cannot
        # come back: the hub rejects its certificate as revoked.
        self.lab.swanctl("hub", "--load-conns", "--file", self.initial_conf)
        self.assertEqual({"node1", "node2"}, hub.conns())
        self.assertRaises(
            vici.exception.CommandException,
            self.lab.charons["node1"].initiate,
            "hub",
        )
        self.assertIn("certificate was revoked", hub.log_text())
        self.assertEqual({}, hub.ike_sas("node1"))
        self.assertFalse(self.lab.ping(1))

        # A second delivery changes nothing and succeeds (it unloads the
        # restored connection again, as the first one did).
        crl_file = os.path.join(self.lab.workdir, "revoked.crl")
        with open(crl_file, "rb") as f:
            crl_bytes = f.read()
        self._action().handle(_event(self.uuids[1]))
        with open(crl_file, "rb") as f:
            self.assertEqual(crl_bytes, f.read())
        self.assertEqual({"node2"}, hub.conns())
        self.assertEqual(node2_sa, set(hub.ike_sas("node2")))
        self.assertTrue(self.lab.ping(2))
