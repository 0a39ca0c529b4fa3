"""The verifier's optional parts without their extras: each is a
configuration error naming the extra to install (the service prints it in
one line and exits 2), never a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import socket
import sys
import tempfile
from unittest import mock

import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier import conf as vconf
from verifier.attest.ownership import ToozOwnership, make_ownership
from verifier.ca import CertificateAuthority
from verifier.cmd import nova_listener as nova_listener_cmd
from verifier.cmd import verifier as verifier_cmd
from verifier.exceptions import ConfigError
from verifier.notify import load_notifiers


def _conf(**groups: dict[str, object]) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    vconf.register_opts(conf)
    conf([], project="trusted-cloud-test")
    for group, values in groups.items():
        for name, value in values.items():
            conf.set_override(name, value, group)
    return conf


class ServerExtrasTest(testtools.TestCase):
    def test_abe_enabled_without_the_abe_extra(self) -> None:
        conf = _conf(abe={"enabled": True})
        with mock.patch.dict(sys.modules, {"pymcl": None}):
            exc = self.assertRaises(ConfigError, verifier_cmd.build_abe, conf, None)
        self.assertIn("[abe] enabled", str(exc))
        self.assertIn("pip install 'trusted-cloud[abe]'", str(exc))

    def test_abe_disabled_needs_nothing(self) -> None:
        with mock.patch.dict(sys.modules, {"pymcl": None}):
            self.assertIsNone(verifier_cmd.build_abe(_conf(), None))

    def test_monitor_enabled_without_the_tpm_extra(self) -> None:
        conf = _conf(monitor={"enabled": True})
        with mock.patch.dict(sys.modules, {"tpm2_pytss": None}):
            exc = self.assertRaises(ConfigError, verifier_cmd.build_monitor, conf)
        self.assertIn("pip install 'trusted-cloud[tpm]'", str(exc))

    def test_coordination_url_without_tooz(self) -> None:
        with mock.patch.dict(sys.modules, {"tooz": None}):
            exc = self.assertRaises(
                ConfigError, make_ownership, "redis://127.0.0.1:1", "m"
            )
        self.assertIn("pip install 'trusted-cloud[scale]'", str(exc))

    def test_coordination_url_without_the_redis_driver(self) -> None:
        ownership = make_ownership("redis://127.0.0.1:1", "m")
        self.assertIsInstance(ownership, ToozOwnership)
        with mock.patch.dict(sys.modules, {"redis": None}):
            exc = self.assertRaises(ConfigError, asyncio.run, ownership.start())
        self.assertIn("redis is not installed", str(exc))
        self.assertIn("pip install 'trusted-cloud[scale]'", str(exc))

    def test_messaging_notifier_without_oslo_messaging(self) -> None:
        public_key = ed25519.Ed25519PrivateKey.generate().public_key()
        with mock.patch.dict(sys.modules, {"oslo_messaging": None}):
            sys.modules.pop("verifier.notify.messaging", None)  # import afresh
            exc = self.assertRaises(
                ConfigError, load_notifiers, _conf(), ["messaging"], public_key
            )
        self.assertIn("notifier 'messaging' cannot start", str(exc))
        self.assertIn("pip install 'trusted-cloud[messaging]'", str(exc))

    def test_nova_listener_without_oslo_messaging_exits_2_in_one_line(self) -> None:
        err = io.StringIO()
        with (
            mock.patch.dict(sys.modules, {"oslo_messaging": None}),
            contextlib.redirect_stderr(err),
        ):
            code = nova_listener_cmd.main([])
        self.assertEqual(2, code)
        self.assertEqual(1, len(err.getvalue().splitlines()), err.getvalue())
        self.assertIn("pip install 'trusted-cloud[messaging]'", err.getvalue())


class PushPortTest(testtools.TestCase):
    def test_push_port_in_use_names_the_option(self) -> None:
        # two verifier processes on one host given the same [push] port: the
        # second says which option to change (it said only "address in use")
        pki = tempfile.mkdtemp(prefix="push-port-")
        self.addCleanup(shutil.rmtree, pki, True)
        ca = CertificateAuthority.create(pki, "test CA")
        ca.issue_to_files(pki, "verifier", ["127.0.0.1"])
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = _conf(
            verifier={
                "host": "127.0.0.1",
                "cert_file": os.path.join(pki, "verifier.pem"),
                "key_file": os.path.join(pki, "verifier-key.pem"),
                "ca_file": os.path.join(pki, "ca.pem"),
            },
            push={"port": port},
        )
        verifier = mock.Mock()
        verifier.push.rules = verifier_cmd.build_push_rules(conf)
        exc = self.assertRaises(
            OSError, asyncio.run, verifier_cmd.start_push_site(conf, verifier)
        )
        self.assertEqual(f"[push] port {port}: Address already in use", exc.strerror)
