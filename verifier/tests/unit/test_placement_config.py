"""The Placement client's configuration and refusals of bad arguments (the
client's behaviour against Placement is in
verifier/tests/functional/test_placement_traits.py, on the real one)."""

from __future__ import annotations

import testtools
from oslo_config import cfg

from verifier.conf import placement as placement_conf
from verifier.exceptions import ConfigError
from verifier.placement import PlacementClient, PlacementError, TraitSync


def _conf(**overrides: object) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    placement_conf.register_opts(conf)
    conf([], project="trusted-cloud", default_config_files=[])
    for name, value in overrides.items():
        conf.set_override(name, value, "placement")
    return conf


class PlacementConfigTest(testtools.TestCase):
    def test_defaults(self) -> None:
        group = _conf().placement
        self.assertEqual("CUSTOM_ATTESTATION_TRUSTED", group.trait)
        self.assertEqual("placement", group.service_type)
        self.assertFalse(group.trait_sync)

    def test_trait_that_is_not_custom_is_refused_by_the_option(self) -> None:
        conf = _conf()
        self.assertRaises(
            ValueError, conf.set_override, "trait", "COMPUTE_X", "placement"
        )

    def test_noauth_without_endpoint_is_a_config_error(self) -> None:
        exc = self.assertRaises(
            ConfigError, PlacementClient.from_conf, _conf(noauth=True)
        )
        self.assertIn("endpoint_override", str(exc))

    def test_noauth_client_from_conf(self) -> None:
        conf = _conf(noauth=True, endpoint_override="http://127.0.0.1:9")
        self.assertIsInstance(PlacementClient.from_conf(conf), PlacementClient)

    def test_sample_config_lists_the_group(self) -> None:
        from verifier.conf import opts

        groups = dict(opts.list_opts())
        names = {o.dest for o in groups["placement"]}
        self.assertLessEqual(
            {"trait_sync", "trait", "retry_interval", "noauth", "auth_type",
             "endpoint_override", "valid_interfaces", "timeout"},
            names,
        )  # fmt: skip


class TraitSyncArgumentsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.client = PlacementClient.noauth("http://127.0.0.1:9")

    def test_trait_that_is_not_custom_is_refused(self) -> None:
        self.assertRaises(
            ConfigError, TraitSync, self.client, "HW_CPU_X86_AVX", retry_interval=1
        )

    def test_provider_that_is_not_a_uuid_is_refused(self) -> None:
        sync = TraitSync(self.client, retry_interval=1)
        exc = self.assertRaises(PlacementError, sync.want, "compute-1", True)
        self.assertEqual("bad_provider", exc.reason)
        exc = self.assertRaises(PlacementError, self.client.get_traits, "../traits")
        self.assertEqual("bad_provider", exc.reason)
        self.assertEqual(0, self.client.requests)

    def test_nothing_pending_before_any_want(self) -> None:
        sync = TraitSync(self.client, retry_interval=1)
        self.assertEqual({}, sync.pump())
        self.assertIsNone(sync.next_due())
        self.assertEqual(0, self.client.requests)
