"""The revocation hooks without their optional extras: the messaging
transport and the vault and ipsec actions each name the extra to install
in one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import fixtures
import testtools
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from ipsec_puppet_vault_hooks import conf as hooks_conf
from ipsec_puppet_vault_hooks.consumer import load_actions
from ipsec_puppet_vault_hooks.exceptions import HooksError

# Runs the listener's entry point with a module made unimportable, as on a
# machine where its extra is not installed.
_WITHOUT = (
    "import sys; sys.modules[sys.argv[1]] = None; "
    "from ipsec_puppet_vault_hooks.cmd.listener import main; "
    "sys.exit(main(sys.argv[2:]))"
)


class HooksExtrasTest(testtools.TestCase):
    def _conf(self) -> cfg.ConfigOpts:
        conf = cfg.ConfigOpts()
        hooks_conf.register_opts(conf)
        conf([], project="trusted-cloud-test")
        return conf

    def _load_without(self, action: str, module: str) -> str:
        plugin = f"ipsec_puppet_vault_hooks.actions.{action}"
        with mock.patch.dict(sys.modules, {module: None}):
            sys.modules.pop(plugin, None)  # import it afresh, without ``module``
            exc = self.assertRaises(HooksError, load_actions, self._conf(), [action])
        return str(exc)

    def test_vault_action_without_hvac_names_the_vault_extra(self) -> None:
        message = self._load_without("vault", "hvac")
        self.assertIn("cannot load action 'vault'", message)
        self.assertIn("pip install 'trusted-cloud[vault]'", message)

    def test_ipsec_action_without_vici_names_the_ipsec_extra(self) -> None:
        message = self._load_without("ipsec", "vici")
        self.assertIn("pip install 'trusted-cloud[ipsec]'", message)

    def test_messaging_transport_without_oslo_messaging_exits_2(self) -> None:
        tmp = self.useFixture(fixtures.TempDir()).path
        key = os.path.join(tmp, "verifier.pub")
        with open(key, "wb") as f:
            f.write(
                ed25519.Ed25519PrivateKey.generate()
                .public_key()
                .public_bytes(
                    serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                )
            )
        path = os.path.join(tmp, "listener.conf")
        with open(path, "w", encoding="utf-8") as f:
            f.write(
                "[revocation_hooks]\nactions = noop\n"
                f"verifier_public_key = {key}\n"
                "[revocation_listener]\ntransports = messaging\n"
            )
        proc = subprocess.run(
            [sys.executable, "-c", _WITHOUT, "oslo_messaging", "--config-file", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(2, proc.returncode, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertIn("transports = messaging needs the 'messaging' extra", proc.stderr)
        self.assertIn("pip install 'trusted-cloud[messaging]'", proc.stderr)
