"""The ``vault`` action against a real OpenBao dev server."""

from __future__ import annotations

import base64
import os
import tempfile
import uuid as uuid_mod

import hvac
import testtools
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from oslo_config import cfg

from ipsec_puppet_vault_hooks import HooksError
from ipsec_puppet_vault_hooks.actions.vault import VaultAction
from ipsec_puppet_vault_hooks.conf import action_vault
from trusted_testing.openbao import OpenBaoDev
from verifier.protocol import RevocationEvent

NODE_POLICY = """
path "transit/encrypt/{key}" {{ capabilities = ["update"] }}
path "transit/decrypt/{key}" {{ capabilities = ["update"] }}
path "transit/export/encryption-key/{key}/*" {{ capabilities = ["read"] }}
path "transit/export/encryption-key/{key}" {{ capabilities = ["read"] }}
"""


def _event(node: str) -> RevocationEvent:
    return RevocationEvent(
        str(uuid_mod.uuid4()),
        node,
        "pcr_policy",
        "PCR 16 changed",
        "2026-11-22T05:00:00Z",
    )


def _local_decrypt(raw_key: bytes, ciphertext: str) -> bytes:
    """Decrypt a transit aes256-gcm96 ciphertext with an exported key."""
    blob = base64.b64decode(ciphertext.split(":", 2)[2])
    return AESGCM(raw_key).decrypt(blob[:12], blob[12:], None)


class VaultActionTest(testtools.TestCase):
    """One OpenBao dev server for the class; each test uses its own nodes,
    keys and mounts' entries."""

    bao: OpenBaoDev

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.bao = OpenBaoDev()
        cls.bao.start()
        try:
            root = hvac.Client(url=cls.bao.url, token=cls.bao.root_token)
            root.sys.enable_secrets_engine("pki", path="pki")
            root.sys.tune_mount_configuration("pki", max_lease_ttl="87600h")
            root.secrets.pki.generate_root("internal", "test root", mount_point="pki")
            root.secrets.pki.create_or_update_role(
                "node",
                {
                    "allow_any_name": True,
                    "allowed_uri_sans": "urn:uuid:*",
                    "ttl": "24h",
                },
                mount_point="pki",
            )
            root.sys.enable_secrets_engine("transit", path="transit")
        except Exception:
            cls.bao.stop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.bao.stop()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.root = hvac.Client(url=self.bao.url, token=self.bao.root_token)
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        token_file = os.path.join(tmp.name, "token")
        with open(token_file, "w") as f:
            f.write(self.bao.root_token + "\n")
        self.action = self._action(token_file)

    def _action(self, token_file: str, **overrides: object) -> VaultAction:
        conf = cfg.ConfigOpts()
        action_vault.register_opts(conf)
        conf([])
        conf.set_override("url", self.bao.url, group="action_vault")
        conf.set_override("token_file", token_file, group="action_vault")
        conf.set_override(
            "state_file",
            os.path.join(self.tmp, "vault-state.jsonl"),
            group="action_vault",
        )
        for name, value in overrides.items():
            conf.set_override(name, value, group="action_vault")
        return VaultAction(conf)

    def _node(self, key: str) -> tuple[str, hvac.Client, str, str]:
        """A node with a certificate, a token reading ``key`` and a lease."""
        node = str(uuid_mod.uuid4())
        self.root.secrets.transit.create_key(
            key, exportable=True, mount_point="transit"
        )
        self.root.sys.create_or_update_policy(
            f"node-{key}", NODE_POLICY.format(key=key)
        )
        token = self.root.auth.token.create(
            policies=[f"node-{key}"], meta={"node_uuid": node}, ttl="1h"
        )["auth"]
        cert = self.root.secrets.pki.generate_certificate(
            "node",
            f"{node}.nodes.example",
            extra_params={"uri_sans": f"urn:uuid:{node}"},
            mount_point="pki",
        )["data"]
        client = hvac.Client(url=self.bao.url, token=token["client_token"])
        return node, client, cert["serial_number"], token["accessor"]

    def _encrypt(self, client: hvac.Client, key: str, data: bytes) -> str:
        answer = client.secrets.transit.encrypt_data(
            key, base64.b64encode(data).decode(), mount_point="transit"
        )
        return str(answer["data"]["ciphertext"])

    def test_revocation_cuts_the_node_off(self) -> None:
        node, client, serial, accessor = self._node("k-node")
        other, other_client, other_serial, _ = self._node("k-other")
        old = self._encrypt(client, "k-node", b"before revocation")
        # The node could export v1 of its key (exportable keys are the
        # worst case: it keeps the raw key material after revocation).
        exported = client.secrets.transit.export_key(
            "k-node", "encryption-key", version=1, mount_point="transit"
        )["data"]["keys"]["1"]
        v1 = base64.b64decode(exported)
        self.assertEqual(b"before revocation", _local_decrypt(v1, old))

        self.action.handle(_event(node))

        # Its token is gone, so it can't ask Vault anything any more.
        self.assertRaises(
            hvac.exceptions.Forbidden, self._encrypt, client, "k-node", b"x"
        )
        self.assertRaises(
            hvac.exceptions.InvalidRequest,
            self.root.auth.token.lookup_accessor,
            accessor,
        )
        # Its certificate is revoked; the other node's is not.
        cert = self.root.secrets.pki.read_certificate(serial, mount_point="pki")["data"]
        self.assertGreater(cert["revocation_time"], 0)
        kept = self.root.secrets.pki.read_certificate(other_serial, mount_point="pki")
        self.assertEqual(0, kept["data"]["revocation_time"])
        # The key it could read was rotated; the other node's key was not.
        key = self.root.secrets.transit.read_key("k-node", mount_point="transit")
        self.assertEqual(2, key["data"]["latest_version"])
        untouched = self.root.secrets.transit.read_key("k-other", mount_point="transit")
        self.assertEqual(1, untouched["data"]["latest_version"])
        # Data encrypted after the revocation uses v2: the exported v1 key
        # can't read it, while authorised clients read old and new data and
        # old data is rewrapped to v2 on access (lazy revocation).
        new = self._encrypt(self.root, "k-node", b"after revocation")
        self.assertTrue(new.startswith("vault:v2:"))
        self.assertRaises(InvalidTag, _local_decrypt, v1, new)
        rewrapped = self.root.secrets.transit.rewrap_data(
            "k-node", old, mount_point="transit"
        )["data"]["ciphertext"]
        self.assertTrue(rewrapped.startswith("vault:v2:"))
        self.assertRaises(InvalidTag, _local_decrypt, v1, rewrapped)
        plain = self.root.secrets.transit.decrypt_data(
            "k-node", rewrapped, mount_point="transit"
        )["data"]["plaintext"]
        self.assertEqual(b"before revocation", base64.b64decode(plain))
        # The other node is not affected.
        self.assertTrue(
            self._encrypt(other_client, "k-other", b"y").startswith("vault:v1:")
        )

    def test_idempotent_and_retried_event_keeps_its_plan(self) -> None:
        node, _, _, _ = self._node("k-idem")
        event = _event(node)
        self.action.handle(event)
        self.action.handle(event)
        # A fresh action (a restarted consumer) reads the plan from the
        # state file: the key is not rotated a second time.
        token_file = os.path.join(self.tmp, "token")
        self._action(token_file).handle(event)
        key = self.root.secrets.transit.read_key("k-idem", mount_point="transit")
        self.assertEqual(2, key["data"]["latest_version"])

    def test_keep_versions_raises_min_decryption_version(self) -> None:
        node, client, _, _ = self._node("k-eager")
        old = self._encrypt(client, "k-eager", b"old")
        action = self._action(os.path.join(self.tmp, "token"), keep_versions=1)
        action.handle(_event(node))
        key = self.root.secrets.transit.read_key("k-eager", mount_point="transit")
        self.assertEqual(2, key["data"]["min_decryption_version"])
        self.assertRaises(
            hvac.exceptions.InvalidRequest,
            self.root.secrets.transit.decrypt_data,
            "k-eager",
            old,
            mount_point="transit",
        )

    def test_unknown_node_changes_nothing(self) -> None:
        _, _, serial, _ = self._node("k-bystander")
        self.action.handle(_event(str(uuid_mod.uuid4())))
        key = self.root.secrets.transit.read_key("k-bystander", mount_point="transit")
        self.assertEqual(1, key["data"]["latest_version"])
        cert = self.root.secrets.pki.read_certificate(serial, mount_point="pki")
        self.assertEqual(0, cert["data"]["revocation_time"])

    def test_vault_down_is_an_action_error(self) -> None:
        token_file = os.path.join(self.tmp, "token")
        action = self._action(token_file)
        action.client.url = "http://127.0.0.1:1"
        action.client.adapter.base_uri = "http://127.0.0.1:1"
        self.assertRaises(HooksError, action.handle, _event(str(uuid_mod.uuid4())))

    def test_missing_configuration_is_refused(self) -> None:
        conf = cfg.ConfigOpts()
        conf([])
        error = self.assertRaises(HooksError, VaultAction, conf)
        self.assertIn("[action_vault] url and token_file", str(error))
