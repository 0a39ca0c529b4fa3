"""The verifier's optional parts without their extras: each is a
configuration error naming the extra to install (the service prints it in
one line and exits 2), never a traceback."""

from __future__ import annotations

import asyncio
import sys
from unittest import mock

import testtools
from oslo_config import cfg

from verifier import conf as vconf
from verifier.attest.ownership import ToozOwnership, make_ownership
from verifier.cmd import verifier as verifier_cmd
from verifier.exceptions import ConfigError


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
